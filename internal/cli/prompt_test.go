package cli

import (
	"bytes"
	"os"
	"strings"
	"testing"
)

// answers returns a readPassword that gives each answer in turn.
func answers(t *testing.T, as ...string) func() ([]byte, error) {
	return func() ([]byte, error) {
		if len(as) == 0 {
			t.Fatal("asked once too often")
		}
		a := as[0]
		as = as[1:]
		return []byte(a), nil
	}
}

func TestNewPassphrasePrompt(t *testing.T) {
	if v, ok := os.LookupEnv("CAIRN_PASSPHRASE"); ok {
		os.Unsetenv("CAIRN_PASSPHRASE")
		t.Cleanup(func() { os.Setenv("CAIRN_PASSPHRASE", v) })
	}
	// A mismatch asks again; a short passphrase warns.
	var errb bytes.Buffer
	e := &env{stderr: &errb, readPassword: answers(t, "correct horse", "correct hose", "short", "short")}
	p, err := e.passphrase(true)()
	if err != nil || string(p) != "short" {
		t.Fatalf("passphrase = %q, %v; want the second pair's", p, err)
	}
	if out := errb.String(); !strings.Contains(out, "differ: try again") || !strings.Contains(out, "warning: a passphrase of 5 characters") {
		t.Fatalf("stderr = %q", out)
	}
	// A long one draws no warning; three mismatches give up.
	errb.Reset()
	e = &env{stderr: &errb, readPassword: answers(t, "a long passphrase", "a long passphrase")}
	if _, err := e.passphrase(true)(); err != nil || strings.Contains(errb.String(), "warning") {
		t.Fatalf("err %v, stderr %q", err, errb.String())
	}
	e = &env{stderr: &errb, readPassword: answers(t, "abcdefgh1", "x", "abcdefgh2", "y", "abcdefgh3", "z")}
	if _, err := e.passphrase(true)(); err == nil || !strings.Contains(err.Error(), "differ") {
		t.Fatalf("three mismatches: err = %v", err)
	}
	// Unlocking an existing keyring asks once and never warns.
	errb.Reset()
	e = &env{stderr: &errb, readPassword: answers(t, "abc")}
	if p, err := e.passphrase(false)(); err != nil || string(p) != "abc" || strings.Contains(errb.String(), "warning") {
		t.Fatalf("unlock: %q, %v, stderr %q", p, err, errb.String())
	}
	// CAIRN_PASSPHRASE for a new keyring warns too.
	t.Setenv("CAIRN_PASSPHRASE", "1234")
	errb.Reset()
	e = &env{stderr: &errb}
	if _, err := e.passphrase(true)(); err != nil || !strings.Contains(errb.String(), "warning") {
		t.Fatalf("env: err %v, stderr %q", err, errb.String())
	}
}

func TestHumanLS(t *testing.T) {
	for n, want := range map[int64]string{0: "0", 1023: "1023", 1024: "1.0K", 1536: "1.5K", 1537: "1.6K", 10 << 10: "10K",
		10<<10 + 1: "11K", 3 << 20: "3.0M", 1023<<10 + 1: "1.0M", 5 << 30: "5.0G"} {
		if got := humanLS(n); got != want {
			t.Errorf("humanLS(%d) = %q, want %q", n, got, want)
		}
	}
}
