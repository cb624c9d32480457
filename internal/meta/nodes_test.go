package meta_test

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/etcdsvc/etcdtest"
	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/pki"
)

func newService(t *testing.T) *meta.Service {
	t.Helper()
	s, err := meta.New(etcdtest.New(t), meta.Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close() })
	return s
}

// secondClient is another process's view of s's etcd.
func secondClient(t *testing.T, s *meta.Service) *clientv3.Client {
	t.Helper()
	c, err := etcdtest.NewClient(s.Client().Endpoints()...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func state(t *testing.T, s *meta.Service, name string) *meta.NodeStatus {
	t.Helper()
	st, err := s.Node(context.Background(), name)
	if err != nil {
		t.Fatal(err)
	}
	return st
}

// A node is offline until it registers, online while its lease lives,
// offline at once after Close and within its lease after it stops
// reporting; a removed node stays listed as removed and cannot register.
func TestNodeRegistry(t *testing.T) {
	ctx := context.Background()
	s := newService(t)
	if _, err := s.Node(ctx, "desk"); !errors.Is(err, cairn.ErrNotFound) {
		t.Fatalf("Node of unknown: %v", err)
	}
	if err := s.PutNode(ctx, meta.NodeRecord{Name: "desk", Role: "device"}); err != nil {
		t.Fatal(err)
	}
	if st := state(t, s, "desk"); st.State != meta.NodeOffline || st.Registered == 0 {
		t.Fatalf("joined node: %+v", st)
	}
	reg, err := s.Register(ctx, meta.NodeRecord{Name: "desk", Role: "device", Addr: "127.0.0.1:1", Capacity: 100, Free: 40}, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	st := state(t, s, "desk")
	if st.State != meta.NodeOnline || st.Addr != "127.0.0.1:1" || st.Capacity != 100 || st.LastSeen == 0 {
		t.Fatalf("registered node: %+v", st)
	}
	if uerr := reg.Update(ctx, meta.NodeRecord{Addr: "127.0.0.1:1", Used: 7, Rate: 1e6}); uerr != nil {
		t.Fatal(uerr)
	}
	if st := state(t, s, "desk"); st.Used != 7 || st.Rate != 1e6 || st.Name != "desk" || st.Registered == 0 {
		t.Fatalf("after update: %+v", st)
	}
	// A liveness key that outlives its node's reports (etcd extends leases
	// when it restarts) does not make it online.
	if perr := s.PutNode(ctx, meta.NodeRecord{Name: "desk", Role: "device", LastSeen: time.Now().Add(-3 * time.Second).UnixNano(), Lease: int64(time.Second)}); perr != nil {
		t.Fatal(perr)
	}
	if st := state(t, s, "desk"); st.State != meta.NodeOffline {
		t.Fatalf("stale reports: %s", st.State)
	}
	if uerr := reg.Update(ctx, meta.NodeRecord{}); uerr != nil {
		t.Fatal(uerr)
	}
	if st := state(t, s, "desk"); st.State != meta.NodeOnline || st.Lease != int64(time.Second) {
		t.Fatalf("after a fresh report: %+v", st)
	}
	if cerr := reg.Close(ctx); cerr != nil {
		t.Fatal(cerr)
	}
	if st := state(t, s, "desk"); st.State != meta.NodeOffline {
		t.Fatalf("after Close: %s", st.State)
	}

	// A node that stops without Close (its keep-alive ends with its
	// process) goes offline when its lease lapses.
	other, err := meta.New(secondClient(t, s), meta.Options{})
	if err != nil {
		t.Fatal(err)
	}
	reg2, err := other.Register(ctx, meta.NodeRecord{Name: "nas", Role: "device"}, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	_ = reg2
	other.Client().Close() // the process dies: no more keep-alives
	deadline := time.Now().Add(5 * time.Second)
	for state(t, s, "nas").State != meta.NodeOffline {
		if time.Now().After(deadline) {
			t.Fatal("a dead node is still online after 5 s with a 1 s lease")
		}
		time.Sleep(100 * time.Millisecond)
	}

	// Removal.
	reg3, err := s.Register(ctx, meta.NodeRecord{Name: "desk", Role: "device"}, time.Second)
	if err != nil {
		t.Fatal(err)
	}
	if rerr := s.RemoveNode(ctx, "desk", time.Time{}); rerr != nil {
		t.Fatal(rerr)
	}
	if st := state(t, s, "desk"); st.State != meta.NodeRemoved || st.Removed == 0 {
		t.Fatalf("after remove: %+v", st)
	}
	if uerr := reg3.Update(ctx, meta.NodeRecord{}); !errors.Is(uerr, cairn.ErrPermission) {
		t.Fatalf("Update of a removed node: %v", uerr)
	}
	reg3.Close(ctx)
	if _, rerr := s.Register(ctx, meta.NodeRecord{Name: "desk"}, time.Second); !errors.Is(rerr, cairn.ErrPermission) {
		t.Fatalf("Register of a removed node: %v", rerr)
	}
	if rerr := s.RemoveNode(ctx, "ghost", time.Time{}); !errors.Is(rerr, cairn.ErrNotFound) {
		t.Fatalf("RemoveNode of unknown: %v", rerr)
	}
	nodes, err := s.Nodes(ctx)
	if err != nil || len(nodes) != 2 || nodes[0].Name != "desk" || nodes[0].State != meta.NodeRemoved || nodes[1].Name != "nas" || nodes[1].State != meta.NodeOffline {
		t.Fatalf("Nodes = %+v, %v", nodes, err)
	}
	// Invited again under its name, it is a fresh node.
	if err := s.PutNode(ctx, meta.NodeRecord{Name: "desk", Role: "device"}); err != nil {
		t.Fatal(err)
	}
	if st := state(t, s, "desk"); st.State != meta.NodeOffline {
		t.Fatalf("re-joined: %+v", st)
	}
}

// The etcd-backed revocation list sees a removal made through another
// client, revokes only certificates issued before it, and is shared.
func TestRevocationsWatch(t *testing.T) {
	ctx := context.Background()
	s := newService(t)
	ca, err := pki.CreateCA(t.TempDir(), "r1")
	if err != nil {
		t.Fatal(err)
	}
	issue := func(name string) *pki.Credentials {
		c, nerr := ca.NewCredentials(pki.NodeIdentity{Realm: "r1", Name: name, Role: pki.Device}, pki.IssueOptions{})
		if nerr != nil {
			t.Fatal(nerr)
		}
		return c
	}
	laptop, phone := issue("laptop"), issue("phone")
	rev, err := s.WatchRevocations(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer rev.Close()
	if revoked, rerr := rev.Revoked(laptop.Leaf); revoked || rerr != nil {
		t.Fatalf("before removal: %v %v", revoked, rerr)
	}
	other, err := meta.New(secondClient(t, s), meta.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if perr := other.PutNode(ctx, meta.NodeRecord{Name: "laptop", Role: "device"}); perr != nil {
		t.Fatal(perr)
	}
	if rerr := other.RemoveNode(ctx, "laptop", time.Time{}); rerr != nil {
		t.Fatal(rerr)
	}
	if rerr := other.RevokeSerial(ctx, phone.Leaf.SerialNumber); rerr != nil {
		t.Fatal(rerr)
	}
	deadline := time.Now().Add(5 * time.Second)
	for {
		a, _ := rev.Revoked(laptop.Leaf)
		b, _ := rev.Revoked(phone.Leaf)
		if a && b {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("revocations not seen: laptop %v phone %v", a, b)
		}
		time.Sleep(20 * time.Millisecond)
	}
	// A certificate issued later (a new invitation) is accepted.
	// NotBefore has second precision: a certificate issued within the
	// revocation's second may still be refused; one a second later is not.
	time.Sleep(1100 * time.Millisecond)
	again := issue("laptop")
	if revoked, rerr := rev.Revoked(again.Leaf); revoked || rerr != nil {
		t.Fatalf("new certificate after removal: %v %v", revoked, rerr)
	}
	// A fresh list loads the same state.
	rev2, err := other.WatchRevocations(ctx)
	if err != nil {
		t.Fatal(err)
	}
	defer rev2.Close()
	if revoked, _ := rev2.Revoked(laptop.Leaf); !revoked {
		t.Fatal("fresh list does not revoke the removed node")
	}
}

// A removal made while Register is between reading the node's record and
// writing it is not overwritten: Register reads again and refuses.
func TestRegisterRacingRemoval(t *testing.T) {
	ctx := context.Background()
	s := newService(t)
	if err := s.PutNode(ctx, meta.NodeRecord{Name: "donor", Role: "benefactor"}); err != nil {
		t.Fatal(err)
	}
	once := false
	defer meta.SetTestHookRegister(func() {
		if once {
			return
		}
		once = true
		if err := s.RemoveNode(ctx, "donor", time.Time{}); err != nil {
			t.Error(err)
		}
	})()
	reg, err := s.Register(ctx, meta.NodeRecord{Name: "donor", Role: "benefactor", Addr: "h:1"}, 2*time.Second)
	if !errors.Is(err, cairn.ErrPermission) {
		if reg != nil {
			reg.Close(ctx)
		}
		t.Fatalf("Register racing a removal: %v, want Permission", err)
	}
	st, err := s.Node(ctx, "donor")
	if err != nil || st.Removed == 0 || st.State != meta.NodeRemoved {
		t.Fatalf("after the race the record is %+v %v: the removal was lost", st, err)
	}
}

// Of concurrent claims of one name exactly one succeeds; a removed node's
// name can be claimed again, and undo puts the removed record back.
func TestClaimNode(t *testing.T) {
	ctx := context.Background()
	s := newService(t)
	const n = 8
	errs := make(chan error, n)
	for i := range n {
		go func() {
			_, err := s.ClaimNode(ctx, meta.NodeRecord{Name: "twin", Role: "device", Addr: fmt.Sprint(i)})
			errs <- err
		}()
	}
	won := 0
	for range n {
		err := <-errs
		switch {
		case err == nil:
			won++
		case !errors.Is(err, cairn.ErrExist):
			t.Fatalf("claim: %v", err)
		}
	}
	if won != 1 {
		t.Fatalf("%d claims of one name succeeded", won)
	}
	if err := s.RemoveNode(ctx, "twin", time.Time{}); err != nil {
		t.Fatal(err)
	}
	undo, err := s.ClaimNode(ctx, meta.NodeRecord{Name: "twin", Role: "benefactor"})
	if err != nil {
		t.Fatalf("claim of a removed node's name: %v", err)
	}
	if st, _ := s.Node(ctx, "twin"); st.Role != "benefactor" || st.Removed != 0 {
		t.Fatalf("after the claim: %+v", st)
	}
	if err := undo(ctx); err != nil {
		t.Fatal(err)
	}
	if st, _ := s.Node(ctx, "twin"); st.Removed == 0 {
		t.Fatalf("undo did not put the removed record back: %+v", st)
	}
}

// RevocationList reads the list under the service's own prefix.
func TestRevocationListPrefix(t *testing.T) {
	ctx := context.Background()
	s, err := meta.New(etcdtest.New(t), meta.Options{Prefix: "/other/"})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if err := s.PutNode(ctx, meta.NodeRecord{Name: "gone", Role: "device"}); err != nil {
		t.Fatal(err)
	}
	if err := s.RemoveNode(ctx, "gone", time.Time{}); err != nil {
		t.Fatal(err)
	}
	names, _, _, err := s.RevocationList(ctx)
	if err != nil || names["gone"].IsZero() {
		t.Fatalf("RevocationList: %v %v", names, err)
	}
}

// A record of format 2 lists its certificates' serials: removing the node
// revokes those and not its name. A record of format 1 (no format, no
// serials: written before cairn recorded them) has its name revoked, as
// format 1 did.
func TestRemoveNodeRevokesSerials(t *testing.T) {
	ctx := context.Background()
	s := newService(t)
	if err := s.PutNode(ctx, meta.NodeRecord{Name: "new", Role: "device", Serials: []string{"abc"}}); err != nil {
		t.Fatal(err)
	}
	if err := s.AddNodeSerial(ctx, "new", "def"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Client().Put(ctx, "/cairn/v1/node/old", `{"name":"old","role":"device","registered":1}`); err != nil {
		t.Fatal(err)
	}
	// An hour behind: a serial's revocation compares no clocks.
	at := time.Now().Add(-time.Hour)
	for _, n := range []string{"new", "old"} {
		if err := s.RemoveNode(ctx, n, at); err != nil {
			t.Fatal(err)
		}
	}
	names, serials, _, err := s.RevocationList(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if _, ok := names["new"]; ok || len(serials) != 2 || serials["abc"].IsZero() || serials["def"].IsZero() {
		t.Fatalf("format 2 removal: names %v serials %v", names, serials)
	}
	if names["old"].IsZero() {
		t.Fatalf("format 1 removal did not revoke the name: %v", names)
	}
	if err := s.AddNodeSerial(ctx, "new", "fed"); !errors.Is(err, cairn.ErrPermission) {
		t.Fatalf("a serial for a removed node: %v", err)
	}
	// A report keeps the serials.
	if err := s.PutNode(ctx, meta.NodeRecord{Name: "live", Role: "device", Serials: []string{"123"}}); err != nil {
		t.Fatal(err)
	}
	reg, err := s.Register(ctx, meta.NodeRecord{Name: "live", Role: "device", Addr: "h:1"}, 2*time.Second)
	if err != nil {
		t.Fatal(err)
	}
	defer reg.Close(ctx)
	if err := reg.Update(ctx, meta.NodeRecord{Name: "live", Role: "device", Addr: "h:2"}); err != nil {
		t.Fatal(err)
	}
	if st, err := s.Node(ctx, "live"); err != nil || len(st.Serials) != 1 || st.Serials[0] != "123" || st.Format != meta.NodeRecordFormat {
		t.Fatalf("after reports: %+v %v", st, err)
	}
}
