package node

import (
	"context"
	"crypto/x509"
	"net/http"

	"cairn.dev/cairn/internal/cairn"
	"cairn.dev/cairn/internal/node/wire"
	"cairn.dev/cairn/internal/pki"
)

// Registrar keeps benefactors and surrogates in the node registry on their
// behalf: they hold no metadata access, so each reports to a device's node
// (DESIGN: "Devices that sleep"; doc/format.md, "Registrar").
type Registrar interface {
	// Register records a report of peer, a benefactor or surrogate whose
	// certificate the node has verified and checked against the
	// revocation list; its name and role come from that certificate only.
	// It is called on the request's goroutine, concurrently for different
	// peers and possibly for the same one. Errors carry their Kind to the
	// peer: Permission (403) tells it that it was removed from the realm
	// and should stop; Unavailable (503) that it should try again or try
	// another registrar.
	Register(ctx context.Context, peer pki.NodeIdentity, rep wire.Report) (wire.RegisterReply, error)
}

func (h *Handler) register(w http.ResponseWriter, r *http.Request, peer pki.NodeIdentity) {
	body, ok := h.readBody(w, r, "register", wire.MaxReport, true)
	if !ok {
		return
	}
	rep, err := wire.DecodeReport(body)
	putBuf(body)
	if err != nil {
		h.fail(w, r, 0, err)
		return
	}
	reply, err := h.cfg.Registrar.Register(r.Context(), peer, rep)
	if err != nil {
		if k := cairn.KindOf(err); k != cairn.Unavailable && k != cairn.Canceled {
			h.log.Warn("registration refused", "node", peer.Name, "role", peer.Role, "err", err)
		}
		h.fail(w, r, 0, err)
		return
	}
	b, err := wire.EncodeJSON(reply)
	if err != nil {
		h.fail(w, r, 0, cairn.E("register", cairn.Other, peer.Name, err))
		return
	}
	h.reply(w, wire.TypeJSON, b)
}

// HandshakeRevocations is the revocation source for the TLS configuration
// of a node's server (pki.ServerTLS) whose chunk service checks rev on
// every request: it refuses at the handshake only a certificate that rev
// says is revoked, and lets the handshake through while rev cannot answer
// (not loaded yet, its source lost). The request is then refused all the
// same, by the chunk service, with 503 (Kind Unavailable) instead of a TLS
// alert: the client can tell "you are revoked" (which a TLS alert then
// always means) from "try again later". Only GET /health and the join
// exchange, open to anyone without a certificate, are reachable meanwhile.
func HandshakeRevocations(rev pki.Revocations) pki.Revocations {
	return handshakeRevocations{rev}
}

type handshakeRevocations struct{ rev pki.Revocations }

func (h handshakeRevocations) Revoked(c *x509.Certificate) (bool, error) {
	revoked, err := h.rev.Revoked(c)
	if err != nil {
		return false, nil
	}
	return revoked, nil
}
