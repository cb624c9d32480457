//go:build race

package cli_test

const raceEnabled = true // see race_test.go
