package cairn

import (
	"errors"
	"fmt"
	"testing"
)

func TestErrorMatchesByKind(t *testing.T) {
	err := E("get", NotFound, "abc", errors.New("no such object"))
	wrapped := fmt.Errorf("reading file: %w", E("read", Other, "vol:/a", err))
	if !errors.Is(wrapped, ErrNotFound) {
		t.Fatalf("errors.Is(%v, ErrNotFound) = false", wrapped)
	}
	if errors.Is(wrapped, ErrCorrupt) {
		t.Fatalf("errors.Is(%v, ErrCorrupt) = true", wrapped)
	}
	if k := KindOf(wrapped); k != NotFound {
		t.Fatalf("KindOf = %v, want NotFound", k)
	}
	if got, want := err.Error(), "get abc: not found: no such object"; got != want {
		t.Fatalf("Error() = %q, want %q", got, want)
	}
}

func TestParseID(t *testing.T) {
	var id ID
	for i := range id {
		id[i] = byte(i)
	}
	got, err := ParseID(id.String())
	if err != nil || got != id {
		t.Fatalf("ParseID(String()) = %v, %v", got, err)
	}
	if _, err := ParseID("xyz"); !errors.Is(err, ErrInvalid) {
		t.Fatalf("ParseID(bad) err = %v, want Invalid", err)
	}
}
