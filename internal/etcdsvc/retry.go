package etcdsvc

import (
	"context"
	"strings"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/status"
)

// leaderChangeErrors are what a request meets when the cluster's leader
// changes under it (a member moving to another device hands leadership
// away: cairn meta move): raft drops proposals while a leadership transfer
// is in progress ("raft proposal dropped", at once on the leader; a
// follower that forwarded one times out with "possibly due to previous
// leader failure", or, when the leader was killed, with a bare "request
// timed out": TestMetaThreeMembersLeaderKilled), and linearizable reads
// see "leader changed". None of
// these requests was applied, except that a timed-out one may have been
// appended before the change; every write of cairn's metadata is a
// transaction guarded by the revisions it read (or a put that may be
// repeated), so a repeat of one that was applied fails its compare and
// reports a conflict, it never applies twice.
var leaderChangeErrors = []string{
	"raft proposal dropped",
	"etcdserver: request timed out", // ", possibly due to previous leader failure" too
	"etcdserver: leader changed",
	"etcdserver: no leader",
}

// leaderChangePatience bounds how long one request is repeated: an
// election after a leader is removed without handing its leadership away
// (cairn meta move on a starved machine) or killed (a 3-member cluster)
// takes an election timeout or a few, longer than the 0.6 s that five
// quick repeats covered; pauses double from 20 ms up to
// leaderChangeMaxPause.
const (
	leaderChangePatience = 10 * time.Second
	leaderChangeMaxPause = 500 * time.Millisecond
)

// RetryLeaderChanges is the dial option of every etcd connection cairn
// makes: it repeats a request failed by a leader change
// (retryLeaderChange). Tests that stand for a cairn client use it too.
func RetryLeaderChanges() grpc.DialOption {
	return grpc.WithChainUnaryInterceptor(retryLeaderChange)
}

// retryLeaderChange is a gRPC interceptor that repeats a unary request
// that failed because of a leader change (leaderChangeErrors), after a
// short pause, while its context lasts, for leaderChangePatience at most.
func retryLeaderChange(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
	pause := 20 * time.Millisecond
	deadline := time.Now().Add(leaderChangePatience)
	for {
		err := invoker(ctx, method, req, reply, cc, opts...)
		if err == nil || !isLeaderChange(err) || time.Now().Add(pause).After(deadline) {
			return err
		}
		select {
		case <-ctx.Done():
			return err
		case <-time.After(pause):
		}
		pause = min(2*pause, leaderChangeMaxPause)
	}
}

func isLeaderChange(err error) bool {
	msg := err.Error()
	if s, ok := status.FromError(err); ok {
		msg = s.Message()
	}
	for _, e := range leaderChangeErrors {
		if strings.Contains(msg, e) {
			return true
		}
	}
	return false
}
