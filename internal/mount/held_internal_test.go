package mount

import (
	"io"
	"log/slog"
	"testing"
)

// TestUnholdKeepsNewerHold: a hold set again while the previous one was
// being settled (a writer opened, mapped and closed during the settle's
// commit) is not cleared by that settle's end.
func TestUnholdKeepsNewerHold(t *testing.T) {
	m := &Mount{cache: &diskCache{}, held: map[*content]*node{}, log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	n := &node{nodeState: &nodeState{}}
	c := &content{held: true, holdGen: 1}
	m.held[c] = n
	gen := c.holdGen // the settle reads its hold
	m.hold(n, c)     // held again meanwhile
	m.unhold(n, c, gen)
	if !c.held || m.held[c] == nil {
		t.Fatal("the end of the settled hold cleared the newer one")
	}
	m.unhold(n, c, c.holdGen)
	if c.held || m.held[c] != nil {
		t.Fatal("the newer hold's own end did not clear it")
	}
}
