package cli

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	"cairn.dev/cairn/internal/apitypes"
	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/pki"
	"cairn.dev/cairn/internal/realm"
)

// statusStoreProbe bounds the one question 'cairn status' asks each store.
const statusStoreProbe = 5 * time.Second

// statusReport gathers this device's and the realm's state for 'cairn
// status': what it cannot learn (the metadata service is unreachable) it
// says in Metadata and Problems instead of failing.
func (e *env) statusReport(ctx context.Context, mounts []apitypes.MountStatus) *apitypes.Status {
	st := &apitypes.Status{Problems: []apitypes.Problem{}, Mounts: mounts}
	if st.Mounts == nil {
		st.Mounts = []apitypes.MountStatus{}
	}
	problem := func(what, format string, a ...any) {
		st.Problems = append(st.Problems, apitypes.Problem{What: what, Detail: fmt.Sprintf(format, a...)})
	}
	if c, err := pki.LoadCredentials(realm.CredentialsDir(e.home)); err == nil {
		st.Device, st.Role, st.Realm = c.Identity.Name, string(c.Identity.Role), c.Identity.Realm
	}
	offline := false
	for _, m := range mounts {
		st.Pending.MountFiles += m.Pending
		if m.Offline != nil {
			offline = true
			problem("mount "+m.Mountpoint, "offline since %s: %s", m.Offline.Since.Local().Format(time.DateTime), m.Offline.Cause)
		}
		if m.CommitsFailed > 0 {
			problem("mount "+m.Mountpoint, "%d commit(s) failed; their data is kept in the mount cache's unsaved/ directory", m.CommitsFailed)
		}
	}
	if ql, err := e.queueList(); err == nil {
		st.Pending.Queue = apitypes.Queue{Files: ql.Files, Bytes: ql.Bytes, Draining: ql.Draining}
	} else {
		problem("upload queue", "%v", err)
	}

	// A mount that already finds the service unreachable: ask it briefly.
	mctx := ctx
	if offline {
		var cancel context.CancelFunc
		mctx, cancel = context.WithTimeout(ctx, offlineDevicesTry)
		defer cancel()
	}
	r, err := e.open(mctx)
	var nodes []meta.NodeStatus
	if err == nil {
		nodes, err = r.Meta.Nodes(mctx)
	}
	if err != nil {
		st.Metadata.Error = err.Error()
		problem("metadata", "the metadata service cannot be reached: %v", err)
		return st
	}
	st.Metadata.Reachable = true
	if st.Device == "" {
		if c, errIn := r.Credentials(ctx); errIn == nil {
			st.Device, st.Role, st.Realm = c.Identity.Name, string(c.Identity.Role), c.Identity.Realm
		}
	}
	if ms, errIn := r.MetaStatus(ctx); errIn == nil {
		st.Metadata.Members = ms
		for _, m := range ms {
			if m.Health != "leader" && m.Health != "follower" {
				problem("metadata member "+m.Node, "%s", m.Health)
			}
		}
	} else if !errors.Is(errIn, cairn.ErrNotFound) {
		problem("metadata", "where it lives: %v", errIn)
	}

	sum := &apitypes.RealmSummary{Nodes: map[string]int{}}
	state := map[string]string{}
	for _, n := range nodes {
		state[n.Name] = n.State
		if n.State == meta.NodeRemoved {
			continue
		}
		sum.Nodes[n.State]++
		switch n.State {
		case meta.NodeStandby:
			sum.Asleep = append(sum.Asleep, n.Name)
		case meta.NodeOffline:
			// One that never reported never ran 'cairn node serve' (a
			// single-machine realm needs none): nothing went wrong.
			if n.LastSeen != 0 {
				problem("node "+n.Name, "offline without announcing it (last seen %s): stopped, crashed or unreachable",
					time.Unix(0, n.LastSeen).Local().Format(time.DateTime))
			}
		}
	}
	st.Summary = sum
	if vols, errIn := r.Meta.Volumes(ctx); errIn == nil {
		sum.Volumes = len(vols)
	} else {
		problem("volumes", "%v", errIn)
	}
	recs, err := r.Meta.Stores(ctx)
	if err != nil {
		problem("stores", "%v", err)
	}
	sum.Stores = len(recs)
	for _, rec := range recs {
		if why := nodeStoreSkip(rec, state); why != "" {
			continue // its node's state is said above; a sleeping one is not woken
		}
		if err := probeStore(ctx, r, rec.Name); err != nil {
			problem("store "+rec.Name, "does not answer: %v", err)
		} else if rec.Draining {
			problem("store "+rec.Name, "draining: 'cairn store remove %s' has not finished", rec.Name)
		}
	}
	if offs, err := r.Offloads(ctx); err == nil {
		for _, o := range offs {
			st.Pending.Offloads++
			st.Pending.OffloadBytes += o.Bytes
		}
	} else {
		problem("offload", "%v", err)
	}
	return st
}

// probeStore asks store name one cheap question.
func probeStore(ctx context.Context, r *realm.Realm, name string) error {
	s, err := r.NamedStore(ctx, name)
	if err != nil {
		return err
	}
	pctx, cancel := context.WithTimeout(ctx, statusStoreProbe)
	defer cancel()
	_, err = s.Has(pctx, []cairn.ID{{}})
	return err
}

// nodeStoreSkip returns why a node's store is not asked (its node is not
// awake: asking could wake it, or hang on it), or "" for a store that may
// be asked. state is each node's state by name.
func nodeStoreSkip(rec meta.StoreRecord, state map[string]string) string {
	name, ok := strings.CutPrefix(rec.URL, "node://")
	if !ok {
		return ""
	}
	name, _, _ = strings.Cut(name, "/")
	st := state[name]
	if st == meta.NodeAwake {
		return ""
	}
	if st == "" {
		st = "not registered"
	}
	return fmt.Sprintf("not asked: node %s is %s (a device is never woken to be asked)", name, st)
}

// printStatus prints st for people.
func (e *env) printStatus(st *apitypes.Status) {
	tw := tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	dev := st.Device
	if dev == "" {
		dev = "(no credentials in " + e.home + ")"
	} else {
		dev = fmt.Sprintf("%s (%s)", st.Device, st.Role)
	}
	fmt.Fprintf(tw, "device\t%s\n", dev)
	switch {
	case !st.Metadata.Reachable:
		fmt.Fprintf(tw, "metadata\tunreachable: %s\n", st.Metadata.Error)
	case len(st.Metadata.Members) == 0:
		fmt.Fprintf(tw, "metadata\treachable (embedded in the realm directory)\n")
	default:
		var ms []string
		for _, m := range st.Metadata.Members {
			ms = append(ms, fmt.Sprintf("%s (%s)", m.Node, m.Health))
		}
		fmt.Fprintf(tw, "metadata\treachable: %s\n", strings.Join(ms, ", "))
	}
	if s := st.Summary; s != nil {
		total := 0
		var states []string
		for k, n := range s.Nodes {
			total += n
			states = append(states, fmt.Sprintf("%d %s", n, k))
		}
		sort.Strings(states)
		line := fmt.Sprintf("%d node(s)", total)
		if len(states) > 0 {
			line += ": " + strings.Join(states, ", ")
		}
		if len(s.Asleep) > 0 {
			line += " (asleep: " + strings.Join(s.Asleep, ", ") + ")"
		}
		fmt.Fprintf(tw, "realm\t%s; %d store(s); %d volume(s)\n", line, s.Stores, s.Volumes)
	}
	var pend []string
	if n := st.Pending.MountFiles; n > 0 {
		pend = append(pend, fmt.Sprintf("%d change(s) on this device's mounts", n))
	}
	if q := st.Pending.Queue; q.Files > 0 {
		d := ""
		if q.Draining {
			d = ", uploading"
		}
		pend = append(pend, fmt.Sprintf("%d file(s) (%s) in the upload queue%s", q.Files, apitypes.IBytes(q.Bytes), d))
	}
	if n := st.Pending.Offloads; n > 0 {
		pend = append(pend, fmt.Sprintf("%d offloaded version(s) (%s) wait for reclaim", n, apitypes.IBytes(st.Pending.OffloadBytes)))
	}
	if len(pend) == 0 {
		pend = []string{"nothing"}
	}
	fmt.Fprintf(tw, "pending\t%s\n", strings.Join(pend, "; "))
	if len(st.Problems) == 0 {
		fmt.Fprintf(tw, "problems\tnone\n")
	} else {
		for i, p := range st.Problems {
			label := ""
			if i == 0 {
				label = "problems"
			}
			fmt.Fprintf(tw, "%s\t%s: %s\n", label, p.What, p.Detail)
		}
	}
	_ = tw.Flush()
	fmt.Fprintln(e.stdout)
	if len(st.Mounts) == 0 {
		fmt.Fprintln(e.stdout, "no mounts of this realm are running on this device")
		return
	}
	tw = tabwriter.NewWriter(e.stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(tw, "MOUNTPOINT\tVOLUME\tMODE\tPID\tPENDING\tCLOSED\tQUEUED\tNAMESPACE\tDONE\tFAILED")
	for _, s := range st.Mounts {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%d\t%d\t%d\t%d\t%d\t%d\t%d\n", s.Mountpoint, s.Volume, s.Mode, s.PID,
			s.Pending, s.Closed, s.Queued, s.Namespace, s.CommitsDone, s.CommitsFailed)
	}
	_ = tw.Flush()
	for _, s := range st.Mounts {
		if s.Offline != nil {
			fmt.Fprintln(e.stdout, offlineLine(s.Mountpoint, s.Offline))
		}
	}
}
