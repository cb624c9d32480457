package node

import (
	"context"
	"crypto/tls"
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

// ServerTLS returns the TLS configuration of a node's server
// (pki.ServerTLS): it refuses no realm certificate for being revoked at the
// handshake. The chunk service checks the revocation list on every request
// instead and answers a revoked client with 403 (Kind Permission) over the
// finished, mutually authenticated connection. A TLS alert comes from a
// peer nobody has authenticated yet (anyone on the path, a stranger at a
// stale address can send one), so clients never take one for "you were
// removed"; a 403 from a node they have verified they may. A revoked
// client gains nothing by finishing the handshake: only GET /health and
// the join exchange, open to anyone, answer it.
func ServerTLS(c *pki.Credentials) (*tls.Config, error) {
	return pki.ServerTLS(c, pki.TLSOptions{Revocations: pki.NoRevocations{}})
}

// HandshakeRevocations is the revocation source for the TLS configuration
// of a standalone node dialing its registrar (pki.ClientTLS): it refuses a
// registrar that rev says is revoked, and lets the handshake through while
// rev cannot answer (not received yet): the registrar's reply brings it.
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
