package etcdsvc

// Membership changes of the realm's etcd (DESIGN decision 13: the metadata
// service follows the awake devices). A member moves to another device in
// etcd's own steps, none of which loses a committed write or stops the
// cluster from taking new ones:
//
//  1. AddLearner: the new member joins as a learner (it votes in nothing,
//     so the quorum does not change), and starts with PeerOptions.Join
//     and the initial cluster AddLearner returns;
//  2. Promote, once it has caught up with the leader's log;
//  3. the old member hands leadership to the new one (Server.HandLeadership)
//     and is removed (RemoveMember), which stops it.

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/durable"
)

// AddLearner adds a learner member named name at peerURL and returns its ID
// and the initial cluster it must start with (every member's name and peer
// URL, the new one's included). Like RemoveMember it retries while etcd
// finds the cluster unhealthy (just after another membership change).
func AddLearner(ctx context.Context, cli *clientv3.Client, name, peerURL string) (uint64, string, error) {
	const op = "add etcd learner"
	var resp *clientv3.MemberAddResponse
	for {
		var err error
		resp, err = cli.MemberAddAsLearner(ctx, []string{peerURL})
		if err == nil {
			break
		}
		if !isUnhealthy(err) {
			return 0, "", cairn.E(op, memberErrKind(ctx, err), name, err)
		}
		select {
		case <-ctx.Done():
			return 0, "", cairn.E(op, cairn.Canceled, name, fmt.Errorf("the cluster stayed unhealthy: %w", ctx.Err()))
		case <-time.After(200 * time.Millisecond):
		}
	}
	var parts []string
	for _, m := range resp.Members {
		n := m.Name
		if m.ID == resp.Member.ID {
			n = name // not started yet: it has no name in the cluster
		}
		if n == "" {
			return 0, "", cairn.E(op, cairn.Unavailable, name, fmt.Errorf("member %x has not started yet: one membership change at a time", m.ID))
		}
		for _, u := range m.PeerURLs {
			parts = append(parts, n+"="+u)
		}
	}
	sort.Strings(parts)
	return resp.Member.ID, strings.Join(parts, ","), nil
}

// Promote makes learner id a voting member as soon as it has caught up with
// the leader, retrying (every 100 ms) while etcd says it has not, until ctx
// ends.
func Promote(ctx context.Context, cli *clientv3.Client, id uint64) error {
	const op = "promote etcd learner"
	for {
		_, err := cli.MemberPromote(ctx, id)
		if err == nil {
			return nil
		}
		if !errors.Is(err, rpctypes.ErrMemberLearnerNotReady) && !strings.Contains(err.Error(), rpctypes.ErrGRPCLearnerNotReady.Error()) {
			return cairn.E(op, memberErrKind(ctx, err), fmt.Sprintf("%x", id), err)
		}
		select {
		case <-ctx.Done():
			return cairn.E(op, cairn.Canceled, fmt.Sprintf("%x", id), fmt.Errorf("the learner did not catch up: %w", ctx.Err()))
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// RemoveMember removes member id from the cluster. A removed member stops.
// etcd refuses to remove a voting member while the others have not been
// connected to each other for its health interval (5 s: "unhealthy
// cluster"), as just after a promotion: RemoveMember retries then, every
// 200 ms, until ctx ends.
func RemoveMember(ctx context.Context, cli *clientv3.Client, id uint64) error {
	const op = "remove etcd member"
	for {
		_, err := cli.MemberRemove(ctx, id)
		if err == nil {
			return nil
		}
		if !isUnhealthy(err) {
			return cairn.E(op, memberErrKind(ctx, err), fmt.Sprintf("%x", id), err)
		}
		select {
		case <-ctx.Done():
			return cairn.E(op, cairn.Canceled, fmt.Sprintf("%x", id), fmt.Errorf("the cluster stayed unhealthy: %w", ctx.Err()))
		case <-time.After(200 * time.Millisecond):
		}
	}
}

// HandLeadership moves raft leadership from this member to member to, if
// this member leads, and returns once to leads (or ctx ends). Removing a
// member that leads would make the cluster elect a new leader first:
// writes in flight then fail or wait an election.
func (s *Server) HandLeadership(ctx context.Context, to uint64) error {
	const op = "hand etcd leadership"
	self := s.MemberID()
	if uint64(s.e.Server.Leader()) != self {
		return nil
	}
	if err := s.e.Server.MoveLeader(ctx, self, to); err != nil {
		return cairn.E(op, memberErrKind(ctx, err), fmt.Sprintf("%x", to), err)
	}
	return nil
}

func memberErrKind(ctx context.Context, err error) cairn.Kind {
	switch {
	case ctx.Err() != nil:
		return cairn.Canceled
	case errors.Is(err, rpctypes.ErrMemberNotFound), errors.Is(err, rpctypes.ErrMemberNotLearner),
		errors.Is(err, rpctypes.ErrPeerURLExist), errors.Is(err, rpctypes.ErrTooManyLearners):
		return cairn.Invalid
	}
	return cairn.Unavailable
}

// PeerFileName is the file in a realm's etcd directory ($home/etcd) whose
// presence makes the realm's daemon start its member with peers: JSON
// {"cert_file","key_file"}, the device's node certificate and key. See
// WritePeerFile.
const PeerFileName = "peer.json"

type peerFile struct {
	CertFile string `json:"cert_file"`
	KeyFile  string `json:"key_file"`
}

// WritePeerFile makes the realm's daemon at home start its member with
// peers from its next start on (PeerOptions, with the member's recorded
// peer URL): its peer listener at PeerSocketPath(home), and certFile and
// keyFile presented to the other members.
func WritePeerFile(home, certFile, keyFile string) error {
	dir := filepath.Join(home, "etcd")
	if err := makePrivateDir(dir); err != nil {
		return cairn.E("write etcd peer file", cairn.IO, dir, err)
	}
	b, _ := json.Marshal(peerFile{CertFile: certFile, KeyFile: keyFile})
	if err := durable.ReplaceFile(filepath.Join(dir, PeerFileName), b, 0o600); err != nil {
		return err
	}
	return nil
}

// PeerSocketPath is where the member of the realm's daemon at home listens
// for peers, once it has them (WritePeerFile).
func PeerSocketPath(home string) string { return filepath.Join(home, "etcd", dataName, "peer.sock") }

// ClientSocketPath is where the realm's daemon at home serves clients.
func ClientSocketPath(home string) string { return filepath.Join(home, "etcd", socketName) }

func readPeerFile(dir string) (*PeerOptions, error) {
	b, err := os.ReadFile(filepath.Join(dir, PeerFileName))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, cairn.E("read etcd peer file", cairn.IO, dir, err)
	}
	var pf peerFile
	if err := json.Unmarshal(b, &pf); err != nil {
		return nil, cairn.E("read etcd peer file", cairn.Corrupt, filepath.Join(dir, PeerFileName), err)
	}
	return &PeerOptions{CertFile: pf.CertFile, KeyFile: pf.KeyFile}, nil
}

// isUnhealthy: etcd refused a membership change because its members have
// not been connected for its health interval yet.
func isUnhealthy(err error) bool {
	return errors.Is(err, rpctypes.ErrUnhealthy) || strings.Contains(err.Error(), rpctypes.ErrGRPCUnhealthy.Error())
}
