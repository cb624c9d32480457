package realm

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/pki"
	"cairn.dev/cairn/internal/store/storetest"
)

// No write goes to a surrogate: the device refuses it as a target and in a
// placement policy, and the surrogate's own server refuses puts (reads it
// serves). A benefactor refuses puts past its donation.
func TestWritesOffSurrogatesAndWithinDonations(t *testing.T) {
	ctx := context.Background()
	a, _ := firstDevice(t)
	cafe := serveStandalone(t, joinAs(t, a, pki.Surrogate, "cafe"), StandaloneOptions{})
	const donation = 100 << 10
	donor := serveStandalone(t, joinAs(t, a, pki.Benefactor, "donor"), StandaloneOptions{Donation: donation})
	waitNode(t, a.Meta, "cafe", meta.NodeOnline, 30*time.Second)
	waitNode(t, a.Meta, "donor", meta.NodeOnline, 30*time.Second)
	// The benefactor reports its donation (record format 5), and what it
	// can still take.
	if st, err := a.Meta.Node(ctx, "donor"); err != nil || st.Donated != donation || st.DonorFree() > donation || st.DonorFree() <= 0 || st.Format != meta.NodeRecordFormat {
		t.Fatalf("the benefactor's record: %+v, %v", st, err)
	}

	// The device.
	if _, err := a.CheckPolicy(ctx, "copies:1@cafe"); !errors.Is(err, cairn.ErrPermission) || !strings.Contains(err.Error(), "surrogate") {
		t.Fatalf("a policy naming a surrogate: %v", err)
	}
	if _, err := a.CheckPolicy(ctx, "copies:1@donor"); err != nil {
		t.Fatalf("a policy naming a benefactor: %v", err)
	}
	a.opts.Target = "cafe"
	if _, err := a.newDirector().ForWrite(ctx, ""); !errors.Is(err, cairn.ErrPermission) || !strings.Contains(err.Error(), "surrogate") {
		t.Fatalf("a surrogate as the write target: %v", err)
	}
	a.opts.Target = ""

	// The surrogate's server.
	id, data := storetest.Blob(5, 30<<10)
	s := dialNode(t, a.Home, cafe.addr, "cafe")
	if err := s.Put(ctx, id, data); !errors.Is(err, cairn.ErrPermission) || !strings.Contains(err.Error(), "surrogate") {
		t.Fatalf("put to a surrogate: %v", err)
	}
	if _, err := s.Get(ctx, id); !errors.Is(err, cairn.ErrNotFound) {
		t.Fatalf("get from a surrogate: %v", err)
	}

	// The benefactor's server: puts until the donation is used up.
	b := dialNode(t, a.Home, donor.addr, "donor")
	accepted := 0
	for i := range 10 {
		id, data := storetest.Blob(uint64(100+i), 30<<10)
		err := b.Put(ctx, id, data)
		if err == nil {
			accepted++
			continue
		}
		if !errors.Is(err, cairn.ErrPermission) || !strings.Contains(err.Error(), "donation") {
			t.Fatalf("put %d past the donation: %v", i, err)
		}
		break
	}
	if accepted == 0 || accepted*(30<<10) > donation {
		t.Fatalf("%d puts of 30 KiB accepted under a donation of %d bytes", accepted, donation)
	}
	if accepted == 10 {
		t.Fatal("the donation was never enforced")
	}
}
