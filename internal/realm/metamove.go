package realm

// Moving the realm's embedded etcd to another device (cairn meta move;
// DESIGN decision 13). The steps are etcd's own membership changes
// (etcdsvc.AddLearner and so on), driven from the device that hosts the
// member; the target's node (cairn node serve) starts the new member when
// the realm asks it to (meta.MetaJoin), and every device follows the
// realm's record of its metadata service (meta.MetaServiceRecord) to the
// new gateway. See doc/format.md, "Metadata keys", metasvc.
//
// Every device's node serves a peer gateway: a metagw (devices only,
// revocations checked) in front of the unix socket of the member it hosts
// or may host (etcdsvc.PeerOptions says why etcd's own peer TLS is not
// enough).

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"

	"cairn.dev/cairn/internal/apitypes"
	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/etcdsvc"
	"cairn.dev/cairn/internal/meta"
	"cairn.dev/cairn/internal/metagw"
	"cairn.dev/cairn/internal/pki"
)

// memberDir is where a device that received the realm's etcd member (cairn
// meta move) keeps it; its node runs it.
func memberDir(home string) string { return filepath.Join(home, "meta") }

// metaDrain is how long a move waits, between recording the new gateways
// and removing the old member, for the devices that follow the record to
// move their connections: a request in flight through the old member when
// it stops would fail.
const metaDrain = 3 * time.Second

// peerSocket is the socket of the member this device hosts or may host.
func (r *Realm) peerSocket() string {
	if r.servesGateway() {
		return etcdsvc.PeerSocketPath(r.Home)
	}
	return filepath.Join(memberDir(r.Home), "peer.sock")
}

// servePeerGateway opens this node's peer gateway next to its chunk
// service (same host, a port of its own) and returns the address it
// advertises. It serves until ctx ends.
func (r *Realm) servePeerGateway(ctx context.Context, creds *pki.Credentials, rev pki.Revocations, listen, advertise string) (string, error) {
	const op = "node serve"
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return "", cairn.E(op, cairn.Invalid, listen, err)
	}
	sock := r.peerSocket()
	gw, err := metagw.New(metagw.Config{Credentials: creds, Revocations: rev, Upstream: []string{"unix://" + sock}, Logger: r.log})
	if err != nil {
		return "", err
	}
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return "", cairn.E(op, cairn.Unavailable, listen, fmt.Errorf("metadata peer gateway: %w", err))
	}
	addr := advertised(ln.Addr().(*net.TCPAddr))
	if h, _, serr := net.SplitHostPort(advertise); serr == nil && advertise != "" {
		_, p, _ := net.SplitHostPort(addr)
		addr = net.JoinHostPort(h, p)
	}
	go func() {
		<-ctx.Done()
		ln.Close()
	}()
	go func() {
		if err := gw.Serve(ctx, ln); err != nil && ctx.Err() == nil {
			r.log.Warn("metadata peer gateway", "err", err)
		}
	}()
	return addr, nil
}

// hostJoinedMember waits for the realm to ask this device to join its
// etcd (cairn meta move --to this device), then runs the member and a
// metadata gateway in front of it until ctx ends. Errors are logged: the
// move that asked times out and says so.
func (r *Realm) hostJoinedMember(ctx context.Context, creds *pki.Credentials, name, peerAddr string) {
	err := r.Meta.WatchMetaJoin(ctx, name, func(j meta.MetaJoin) bool {
		if j.Joined != "" {
			return true
		}
		if err := r.runJoinedMember(ctx, creds, name, peerAddr, j); err != nil {
			r.log.Error("join the realm's etcd", "err", err)
		}
		return false
	})
	if err != nil && ctx.Err() == nil {
		r.log.Warn("watch for metadata joins", "err", err)
	}
}

func (r *Realm) runJoinedMember(ctx context.Context, creds *pki.Credentials, name, peerAddr string, j meta.MetaJoin) error {
	const op = "join the realm's etcd"
	dir := memberDir(r.Home)
	credDir := CredentialsDir(r.Home)
	srv, err := etcdsvc.StartEmbedded(ctx, dir, etcdsvc.Options{Peer: &etcdsvc.PeerOptions{
		Name: name, Listen: peerAddr,
		CertFile: filepath.Join(credDir, pki.NodeCertFile), KeyFile: filepath.Join(credDir, pki.NodeKeyFile),
		InitialCluster: j.InitialCluster, Join: true,
	}})
	if err != nil {
		return err
	}
	rev, err := r.revocations(ctx)
	if err != nil {
		srv.Close()
		return err
	}
	gw, err := metagw.New(metagw.Config{Credentials: creds, Revocations: rev, Upstream: []string{srv.Endpoint()}, Logger: r.log})
	if err != nil {
		srv.Close()
		return err
	}
	host, _, _ := net.SplitHostPort(peerAddr)
	ln, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		srv.Close()
		return cairn.E(op, cairn.Unavailable, host, err)
	}
	gwAddr := ln.Addr().String()
	go func() {
		defer srv.Close()
		go func() { <-ctx.Done(); ln.Close() }()
		if err := gw.Serve(ctx, ln); err != nil && ctx.Err() == nil {
			r.log.Warn("metadata gateway", "err", err)
		}
	}()
	j.Joined = gwAddr
	return r.Meta.PutMetaJoin(ctx, name, j)
}

// EnableMetaPeers makes the realm's embedded etcd, hosted by this device,
// able to take peers: its daemon restarts with a peer listener if it
// runs without one (the daemon reads etcdsvc.PeerFileName, which this
// device's node writes when it serves). Requests in flight during that
// restart fail; a daemon started after the node first served needs none.
func (r *Realm) EnableMetaPeers(ctx context.Context) error {
	const op = "meta move"
	if !r.servesGateway() {
		return cairn.E(op, cairn.Invalid, r.Home, errors.New("this device does not host the realm's embedded etcd"))
	}
	if _, err := os.Stat(etcdsvc.PeerSocketPath(r.Home)); err == nil {
		return nil
	}
	if _, err := os.Stat(filepath.Join(r.Home, "etcd", etcdsvc.PeerFileName)); err != nil {
		return cairn.E(op, cairn.Unavailable, r.Home, errors.New("this device's node has not served yet: run 'cairn node serve' here first"))
	}
	if err := etcdsvc.StopDaemon(r.Home); err != nil {
		return err
	}
	c, err := etcdsvc.Connect(ctx, r.Home, etcdsvc.ConnectOptions{})
	if err != nil {
		return err
	}
	c.Close() // r's own connection keeps the daemon up
	if _, err := os.Stat(etcdsvc.PeerSocketPath(r.Home)); err != nil {
		return cairn.E(op, cairn.Unavailable, r.Home, fmt.Errorf("the etcd daemon restarted without peers: %w", err))
	}
	return nil
}

// MoveMetaOptions tune MoveMeta.
type MoveMetaOptions struct {
	// Progress, if set, is told each step.
	Progress func(step string)
	// Timeout bounds the wait for the target's member (default 2 min).
	Timeout time.Duration
}

func (o MoveMetaOptions) say(s string) {
	if o.Progress != nil {
		o.Progress(s)
	}
}

// joinedMember is a member addMetaMember added.
type joinedMember struct {
	selfID, id    uint64 // this device's member, the new one
	gateway, peer string // the new one's gateway and peer gateway
}

// addMetaMember adds device to as a member of the realm's etcd, hosted by
// this device: to's node starts it as a learner, it is promoted once it
// has caught up. alone: the cluster must have this member only (a move).
// The membership changes are bounded by tctx.
func (r *Realm) addMetaMember(ctx, tctx context.Context, op, to string, o MoveMetaOptions, alone bool) (joinedMember, error) {
	var j joinedMember
	self, err := r.selfName(ctx)
	if err != nil {
		return j, err
	}
	if to == self {
		return j, cairn.E(op, cairn.Invalid, to, errors.New("this device hosts the metadata already"))
	}
	st, err := r.Meta.Node(ctx, to)
	if err != nil {
		return j, err
	}
	if st.Role != string(pki.Device) || st.State != meta.NodeOnline {
		return j, cairn.E(op, cairn.Invalid, to, fmt.Errorf("want an online device, it is a %s, %s", st.Role, st.State))
	}
	if err = r.EnableMetaPeers(ctx); err != nil {
		return j, err
	}
	selfPeer, err := r.Meta.MetaPeer(ctx, self)
	if err != nil {
		return j, err
	}
	if j.peer, err = r.Meta.MetaPeer(ctx, to); err != nil {
		return j, err
	}
	cli := r.conn.Client()
	ml, err := cli.MemberList(ctx)
	if err != nil {
		return j, cairn.E(op, cairn.Unavailable, "", err)
	}
	if alone && len(ml.Members) != 1 {
		return j, cairn.E(op, cairn.Invalid, "", fmt.Errorf("the realm's etcd has %d members: this cairn moves a single member only", len(ml.Members)))
	}
	sr, err := cli.Status(ctx, r.conn.Endpoints()[0])
	if err != nil {
		return j, cairn.E(op, cairn.Unavailable, "", err)
	}
	j.selfID = sr.Header.MemberId
	for _, m := range ml.Members {
		if m.ID == j.selfID && !slices.Contains(m.PeerURLs, "https://"+selfPeer) {
			if _, err = cli.MemberUpdate(ctx, j.selfID, []string{"https://" + selfPeer}); err != nil {
				return j, cairn.E(op, cairn.Unavailable, selfPeer, err)
			}
		}
		if m.Name == to || slices.Contains(m.PeerURLs, "https://"+j.peer) {
			return j, cairn.E(op, cairn.Exist, to, errors.New("it is a member of the realm's etcd already"))
		}
	}
	o.say("adding " + to + " as a learner")
	id, initial, err := etcdsvc.AddLearner(tctx, cli, to, "https://"+j.peer)
	if err != nil {
		return j, err
	}
	j.id = id
	undo := func(cause error) (joinedMember, error) {
		dctx, dcancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer dcancel()
		_ = etcdsvc.RemoveMember(dctx, cli, id)
		_ = r.Meta.DeleteMetaJoin(dctx, to)
		return j, cause
	}
	if err = r.Meta.PutMetaJoin(tctx, to, meta.MetaJoin{ID: strconv.FormatUint(id, 16), InitialCluster: initial}); err != nil {
		return undo(err)
	}
	werr := r.Meta.WatchMetaJoin(tctx, to, func(mj meta.MetaJoin) bool {
		j.gateway = mj.Joined
		return j.gateway == ""
	})
	if j.gateway == "" {
		return undo(cairn.E(op, cairn.Unavailable, to, fmt.Errorf("its member did not start (is 'cairn node serve' running there, with this cairn?): %w", werr)))
	}
	o.say("promoting " + to)
	if err = etcdsvc.Promote(tctx, cli, id); err != nil {
		return undo(err)
	}
	return j, nil
}

// AddMeta adds device to as a member of the realm's embedded etcd, hosted
// by this device (cairn meta add): to's node, which must be serving, starts
// a member that joins as a learner and is promoted once it has caught up,
// and the realm records its gateway beside the others (devices follow the
// record and spread their requests over all the gateways). A realm with
// three members on devices that are usually on keeps its metadata while
// any one of them is down.
func (r *Realm) AddMeta(ctx context.Context, to string, o MoveMetaOptions) error {
	const op = "meta add"
	if o.Timeout <= 0 {
		o.Timeout = 2 * time.Minute
	}
	tctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	j, err := r.addMetaMember(ctx, tctx, op, to, o, false)
	if err != nil {
		return err
	}
	o.say("recording " + to + "'s gateway " + j.gateway)
	if err := r.Meta.UpdateMetaService(tctx, func(rec *meta.MetaServiceRecord) bool {
		rec.Members = append(slices.DeleteFunc(rec.Members, func(m meta.MetaMember) bool { return m.Node == to }),
			meta.MetaMember{Node: to, Gateway: j.gateway, Peer: j.peer})
		return true
	}); err != nil {
		return err
	}
	return r.Meta.DeleteMetaJoin(tctx, to)
}

// MoveMeta moves the realm's embedded etcd from this device, which hosts
// it, to device to, whose node must be serving: to's member joins as a
// learner, is promoted once it has caught up, this member hands leadership
// to it (if that fails, three times, the new member is removed again and
// the move fails: the metadata stays here), the realm records to's gateway (devices follow it: their clients'
// endpoints change), and after metaDrain this member is removed (asked of
// the new one). This device then reaches the metadata through to's gateway
// (its realm.json says so) and keeps its old data dir as etcd.moved-<unix
// seconds>; this process's connection, and that of its running node
// (which follows the record: followMovedMember), go through to's gateway
// too. No committed write is lost; the requests that the leadership
// handover drops are repeated by the client (etcdsvc's retry of leader
// changes), so devices see a pause, not a failure.
func (r *Realm) MoveMeta(ctx context.Context, to string, o MoveMetaOptions) error {
	const op = "meta move"
	say := o.say
	if o.Timeout <= 0 {
		o.Timeout = 2 * time.Minute
	}
	tctx, cancel := context.WithTimeout(ctx, o.Timeout)
	defer cancel()
	j, err := r.addMetaMember(ctx, tctx, op, to, o, true)
	if err != nil {
		return err
	}
	selfID, id, gwTo, toPeer := j.selfID, j.id, j.gateway, j.peer
	cli := r.conn.Client()
	say("handing leadership to " + to)
	if err = handLeadership(tctx, cli, r.conn.Endpoints()[0], selfID, id); err != nil {
		// This member is not removed while it may lead: in a cluster of
		// two, the leader can commit its own removal and stop before
		// the other has learnt of the commit, which then never gets the
		// two votes its configuration still asks for (the move hung on
		// the removal, under load). The new member, a follower, goes
		// instead: the realm stays here, as before the move, which may
		// be tried again.
		say("leadership not handed to " + to + ": undoing the move")
		r.log.Warn("meta move: leadership not handed: undoing the move", "to", to, "err", err)
		dctx, dcancel := context.WithTimeout(context.WithoutCancel(ctx), 30*time.Second)
		defer dcancel()
		if rerr := whileUnavailable(dctx, func() error { return etcdsvc.RemoveMember(dctx, cli, id) }); rerr != nil {
			return cairn.E(op, cairn.Unavailable, to, fmt.Errorf("leadership could not be handed to it (%w), and its member could not be removed: %w", err, rerr))
		}
		_ = r.Meta.DeleteMetaJoin(dctx, to)
		return cairn.E(op, cairn.Unavailable, to, fmt.Errorf("leadership could not be handed to it: %w; the move is undone, the metadata stays here (try again)", err))
	}
	say("recording " + to + "'s gateway " + gwTo)
	if err = whileUnavailable(tctx, func() error {
		return r.Meta.UpdateMetaService(tctx, func(rec *meta.MetaServiceRecord) bool {
			rec.Members = []meta.MetaMember{{Node: to, Gateway: gwTo, Peer: toPeer}}
			return true
		})
	}); err != nil {
		return err
	}
	_ = r.Meta.DeleteMetaJoin(tctx, to)
	// This process's own connection follows too, before its member goes.
	if err = r.redirectMeta([]string{gwTo}); err != nil {
		return err
	}
	select {
	case <-time.After(metaDrain):
	case <-tctx.Done():
		return cairn.E(op, cairn.Canceled, to, tctx.Err())
	}
	say("removing this device's member")
	// Asked of the new member, through its gateway: this member stops as
	// it applies its removal, and might not answer.
	cfg, err := readConfig(r.Home)
	if err != nil {
		return err
	}
	cfg.Gateway = []string{gwTo}
	conn, _, err := connectGateways(tctx, r.Home, cfg, r.opts.MetaWait)
	if err != nil {
		return err
	}
	tries := 0
	err = whileUnavailable(tctx, func() error {
		tries++
		rerr := etcdsvc.RemoveMember(tctx, conn.Client(), selfID)
		if tries > 1 && rerr != nil && strings.Contains(rerr.Error(), rpctypes.ErrMemberNotFound.Error()) {
			return nil // a try that timed out removed it
		}
		return rerr
	})
	conn.Close()
	if err != nil {
		return err
	}
	// This device now reaches the metadata as the others do.
	cfg.Etcd, cfg.Gateway, cfg.GatewayNode = nil, []string{gwTo}, ""
	if err := saveConfig(r.Home, cfg); err != nil {
		return err
	}
	if err := etcdsvc.StopDaemon(r.Home); err != nil {
		r.log.Warn("stop the removed member's daemon", "err", err)
	}
	old := filepath.Join(r.Home, "etcd")
	if err := os.Rename(old, old+".moved-"+strconv.FormatInt(time.Now().Unix(), 10)); err != nil {
		return cairn.E(op, cairn.IO, old, err)
	}
	return nil
}

// whileUnavailable calls f again, every 500 ms, while it fails with Kind
// Unavailable and ctx lasts: a step of a move that etcd did not answer in
// time (on a starved machine the two members of a move can lose their
// leader and elect one again, several times: TestMetaMoveCommand failed
// recording the new gateway under GOMAXPROCS=1 and CPU load). Only for
// steps that may be repeated: the record's update rewrites the same
// members, and the removal's repeat takes "member not found" for done.
func whileUnavailable(ctx context.Context, f func() error) error {
	for {
		err := f()
		if err == nil || cairn.KindOf(err) != cairn.Unavailable || ctx.Err() != nil {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(500 * time.Millisecond):
		}
	}
}

// leadershipAttempts and leadershipAttempt bound handLeadership: raft
// gives a transfer up when the transferee has not won its election within
// an election timeout (on a starved machine: TestMetaMoveCommand once
// waited 2 min for one), and etcd's MoveLeader then waits until its
// context ends, so each attempt has a bound of its own.
const (
	leadershipAttempts = 3
	leadershipAttempt  = 5 * time.Second
)

// transferLeadership asks the member that cli reaches (the leader) to hand
// leadership to member to. A variable for tests.
var transferLeadership = func(ctx context.Context, cli *clientv3.Client, to uint64) error {
	_, err := cli.MoveLeader(ctx, to)
	return err
}

// handLeadership hands raft leadership from member self, which cli reaches
// at endpoint ep, to member to, and returns once to leads (etcd's status
// says so): up to leadershipAttempts transfers, each of at most
// leadershipAttempt, and before each a look at who leads (a transfer may
// succeed after its attempt gave up; while an election is under way it
// waits for its outcome). Else it returns why the last attempt failed.
func handLeadership(ctx context.Context, cli *clientv3.Client, ep string, self, to uint64) error {
	var last error
	for tries := 0; tries < leadershipAttempts; {
		sctx, cancel := context.WithTimeout(ctx, leadershipAttempt)
		sr, err := cli.Status(sctx, ep)
		cancel()
		switch {
		case err != nil:
			last = fmt.Errorf("status of %s: %w", ep, err)
			tries++
		case sr.Leader == to:
			return nil
		case sr.Leader != self:
			// No leader, or an election: wait for its outcome.
			last = fmt.Errorf("member %x leads, not this one", sr.Leader)
		default:
			tries++
			actx, acancel := context.WithTimeout(ctx, leadershipAttempt)
			err = transferLeadership(actx, cli, to)
			acancel()
			if err != nil {
				last = fmt.Errorf("hand leadership: %w", err)
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	return last
}

// MetaMemberStatus is one device that serves the realm's metadata, as
// `cairn devices` shows it.
type MetaMemberStatus = apitypes.MetaMember

// MetaStatus reports where the realm's metadata lives: the members of its
// embedded etcd, each with its gateway and health. A realm on an external
// etcd cluster has no record: NotFound.
func (r *Realm) MetaStatus(ctx context.Context) ([]MetaMemberStatus, error) {
	const op = "metadata status"
	rec, err := r.Meta.MetaService(ctx)
	if err != nil {
		return nil, err
	}
	cli := r.conn.Client()
	ml, err := cli.MemberList(ctx)
	if err != nil {
		return nil, cairn.E(op, cairn.Unavailable, "", err)
	}
	var leader uint64
	for _, ep := range r.conn.Endpoints() {
		if sr, serr := cli.Status(ctx, ep); serr == nil {
			leader = sr.Leader
			break
		}
	}
	out := make([]MetaMemberStatus, 0, len(rec.Members))
	for _, m := range rec.Members {
		st := MetaMemberStatus{Node: m.Node, Gateway: m.Gateway, Health: "unknown"}
		for _, em := range ml.Members {
			// A joined member carries its node name; the member a realm
			// starts with is "cairn", known by its peer URL or alone.
			if em.Name != m.Node && (m.Peer == "" || !slices.Contains(em.PeerURLs, "https://"+m.Peer)) && len(ml.Members) > 1 {
				continue
			}
			switch {
			case em.IsLearner:
				st.Health = "learner"
			case len(em.ClientURLs) == 0:
				st.Health = "not started"
			case em.ID == leader:
				st.Health = "leader"
			default:
				st.Health = "follower"
			}
			break
		}
		out = append(out, st)
	}
	return out, nil
}
