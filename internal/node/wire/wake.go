package wire

import (
	"errors"
	"fmt"

	"cairn.dev/cairn/internal/cairn"
)

// WakeVersion is the version of the wake request and reply (doc/power.md,
// "Wake proxy").
const WakeVersion = 1

// MaxWake bounds the body of a wake request or reply.
const MaxWake = 4 << 10

// WakeRequest asks a node, the wake proxy, to send a Wake-on-LAN magic
// packet for Node. It names the node only: the proxy reads the MAC and
// the broadcast address from the node's record in the realm's metadata,
// never from the request, so a device can ask for a wake of a node of the
// realm and of nothing else.
type WakeRequest struct {
	V    int    `json:"v"`
	Node string `json:"node"`
}

// WakeReply says what the proxy sent: Packets magic packets for MAC to
// Broadcast.
type WakeReply struct {
	V         int    `json:"v"`
	Node      string `json:"node"`
	MAC       string `json:"mac"`
	Broadcast string `json:"broadcast"`
	Packets   int    `json:"packets"`
}

// DecodeWakeRequest decodes and checks a wake request (Kind Invalid).
func DecodeWakeRequest(b []byte) (WakeRequest, error) {
	var r WakeRequest
	if err := DecodeJSON(b, &r); err != nil {
		return r, err
	}
	if r.V != WakeVersion {
		return r, cairn.E("wake", cairn.Invalid, r.Node, fmt.Errorf("wake request version %d: want %d", r.V, WakeVersion))
	}
	if r.Node == "" {
		return r, cairn.E("wake", cairn.Invalid, "", errors.New("wake request names no node"))
	}
	return r, nil
}
