package node

import (
	"context"
	"net/http"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/node/wire"
	"cairn.dev/cairn/internal/pki"
)

// Waker sends Wake-on-LAN magic packets on behalf of the realm's devices:
// the node is a wake proxy, an always-on machine on a sleeper's LAN (a
// magic packet from another network never arrives). doc/power.md, "Wake
// proxy".
type Waker interface {
	// Wake sends a burst of magic packets for node, a node of the realm,
	// to the broadcast address its record names. peer is the device that
	// asks (its certificate verified and not revoked, its role a device's).
	// Errors carry their Kind to the peer: NotFound (no such node),
	// Invalid (no wake method), Unavailable.
	Wake(ctx context.Context, peer pki.NodeIdentity, node string) (wire.WakeReply, error)
}

func (h *Handler) wake(w http.ResponseWriter, r *http.Request, peer pki.NodeIdentity) {
	body, ok := h.readBody(w, r, "wake", wire.MaxWake, true)
	if !ok {
		return
	}
	req, err := wire.DecodeWakeRequest(body)
	putBuf(body)
	if err != nil {
		h.fail(w, r, 0, err)
		return
	}
	reply, err := h.cfg.Waker.Wake(r.Context(), peer, req.Node)
	if err != nil {
		h.log.Warn("wake refused", "by", peer.Name, "node", req.Node, "err", err)
		h.fail(w, r, 0, err)
		return
	}
	reply.V = wire.WakeVersion
	b, err := wire.EncodeJSON(reply)
	if err != nil {
		h.fail(w, r, 0, cairn.E("wake", cairn.Other, req.Node, err))
		return
	}
	h.log.Info("woke a node for a device", "by", peer.Name, "node", req.Node, "mac", reply.MAC, "broadcast", reply.Broadcast)
	h.reply(w, wire.TypeJSON, b)
}
