package cli_test

// raceEnabled (race_on_test.go, race_off_test.go) is true in a test
// binary built with -race.
//
// CI runs the suite twice (scripts/test.sh): without -race, then with it.
// The first pass runs every kill loop and workload in its full CI form;
// the -race pass runs the long ones in a shorter form (raceShort), enough
// to take each code path under the race detector once. Under -race every
// CLI process these tests start is a race-built binary too, 5-10x slower:
// internal/cli alone took 2,339 s of CI's 60 minutes (2026-12-02) before
// the -race forms were cut down. The environment knobs (CAIRN_TEST_*_KILLS
// and the like) still set the count, with or without -race.

// raceShort is n, or short under -race.
func raceShort(n, short int) int {
	if raceEnabled {
		return short
	}
	return n
}
