package pki

import (
	"bytes"
	"context"
	"crypto"
	"crypto/aes"
	"crypto/cipher"
	"crypto/rand"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/zeebo/blake3"

	"cairn.dev/cairn/internal/cairn"
)

// JoinPath is where a node serves the join exchange (without a client
// certificate: the token authenticates the joiner).
const JoinPath = "/v1/join"

// Limits of the join exchange.
const (
	MaxTokenTTL      = 30 * 24 * time.Hour
	MaxPayload       = 1 << 20  // bytes of a device payload, before sealing
	maxJoinRequest   = 64 << 10 // bytes of a join request body
	maxJoinResponse  = 4 << 20  // bytes of a join response body
	joinFormat       = 1
	macSize          = 32
	joinRequestMAC   = "cairn v1 join request"
	joinResponseMAC  = "cairn v1 join response"
	joinPayloadAAD   = "cairn v1 join payload"
	defaultJoinTimeo = 30 * time.Second
)

// Authority issues join tokens and redeems them: it runs on a device that
// holds the realm CA's key.
type Authority struct {
	CA     *CA
	Tokens TokenStore
	// Addr is the host:port at which joiners reach this authority's join
	// endpoint; it goes into every token.
	Addr   string
	Logger *slog.Logger // nil discards
	// Issued, if set, is called with each certificate Redeem issues,
	// before the joiner gets it (the realm records its serial, so that a
	// removal revokes exactly the node's certificates): if it fails, so
	// does the join.
	Issued func(ctx context.Context, id NodeIdentity, cert *x509.Certificate) error

	now func() time.Time // tests
}

func (a *Authority) clock() time.Time {
	if a.now != nil {
		return a.now()
	}
	return time.Now()
}

func (a *Authority) log() *slog.Logger {
	if a.Logger != nil {
		return a.Logger
	}
	return slog.New(slog.DiscardHandler)
}

// NewToken records and returns a one-time token that lets one machine join
// the realm as role, named name (empty: the joiner proposes its name), until
// ttl has passed. payload, for a device only, is sealed end to end under a
// key derived from the token's secret (which the server does not keep) and
// handed to the joiner; it is where the volume keys travel. Benefactors and
// surrogates get no payload: passing one is an error.
func (a *Authority) NewToken(ctx context.Context, role Role, name string, ttl time.Duration, payload []byte) (string, error) {
	const op = "new join token"
	if _, err := ParseRole(string(role)); err != nil {
		return "", err
	}
	if name != "" {
		if err := ValidName(name); err != nil {
			return "", err
		}
	}
	if ttl <= 0 || ttl > MaxTokenTTL {
		return "", cairn.E(op, cairn.Invalid, "", fmt.Errorf("ttl %v outside (0, %v]", ttl, MaxTokenTTL))
	}
	if payload != nil && role != Device {
		return "", cairn.E(op, cairn.Invalid, "", fmt.Errorf("a %s receives no payload", role))
	}
	if len(payload) > MaxPayload {
		return "", cairn.E(op, cairn.Invalid, "", fmt.Errorf("payload of %d bytes exceeds %d", len(payload), MaxPayload))
	}
	if _, _, err := net.SplitHostPort(a.Addr); err != nil || len(a.Addr) > 255 {
		return "", cairn.E(op, cairn.Invalid, a.Addr, fmt.Errorf("join address must be host:port of at most 255 bytes: %v", err))
	}
	t, err := newToken(a.CA.Fingerprint(), a.Addr)
	if err != nil {
		return "", cairn.E(op, cairn.Other, "", err)
	}
	now := a.clock().UTC()
	mk := t.MACKey()
	rec := TokenRecord{ID: t.IDString(), MACKey: mk[:], Role: role, Name: name, Created: now, Expires: now.Add(ttl)}
	if payload != nil {
		if rec.Payload, err = sealPayload(t, role, payload); err != nil {
			return "", cairn.E(op, cairn.Other, "", err)
		}
	}
	if err := a.Tokens.Add(ctx, rec); err != nil {
		return "", err
	}
	a.log().Info("join token issued", "token", rec.ID, "role", role, "name", name, "expires", rec.Expires)
	return t.String(), nil
}

func payloadAAD(t Token, role Role) []byte {
	return []byte(joinPayloadAAD + "\x00" + t.IDString() + "\x00" + string(role))
}

// sealPayload encrypts payload with AES-256-GCM under the token's payload
// key: nonce (12 random bytes) || ciphertext || tag.
func sealPayload(t Token, role Role, payload []byte) ([]byte, error) {
	k := t.payloadKey()
	aead, err := newGCM(k[:])
	if err != nil {
		return nil, err
	}
	nonce := make([]byte, aead.NonceSize(), aead.NonceSize()+len(payload)+aead.Overhead())
	if _, err := rand.Read(nonce); err != nil {
		return nil, err
	}
	return aead.Seal(nonce, nonce, payload, payloadAAD(t, role)), nil
}

// openPayload reverses sealPayload.
func openPayload(t Token, role Role, sealed []byte) ([]byte, error) {
	k := t.payloadKey()
	aead, err := newGCM(k[:])
	if err != nil {
		return nil, err
	}
	if len(sealed) < aead.NonceSize()+aead.Overhead() {
		return nil, errors.New("sealed payload too short")
	}
	return aead.Open(nil, sealed[:aead.NonceSize()], sealed[aead.NonceSize():], payloadAAD(t, role))
}

func newGCM(key []byte) (cipher.AEAD, error) {
	b, err := aes.NewCipher(key)
	if err != nil {
		return nil, err
	}
	return cipher.NewGCM(b)
}

// JoinRequest is the body of POST JoinPath (JSON).
type JoinRequest struct {
	Format int    `json:"format"`
	Token  string `json:"token"` // hex of Token.ID
	CSR    []byte `json:"csr"`   // DER PKCS#10, signed by the joiner's new key
	MAC    []byte `json:"mac"`   // requestMAC
}

// JoinResponse is the answer to a JoinRequest (JSON).
type JoinResponse struct {
	Format  int    `json:"format"`
	Cert    []byte `json:"cert"`              // DER node certificate
	CA      []byte `json:"ca"`                // DER realm CA certificate
	Payload []byte `json:"payload,omitempty"` // sealed device payload
	MAC     []byte `json:"mac"`               // responseMAC
}

// mac is keyed BLAKE3 under the token's MAC key over a context string and
// length-prefixed fields.
func mac(key []byte, context string, fields ...[]byte) []byte {
	h, err := blake3.NewKeyed(key)
	if err != nil {
		panic(err) // key is 32 bytes by construction
	}
	var n [8]byte
	for _, f := range append([][]byte{[]byte(context)}, fields...) {
		putUint64(n[:], uint64(len(f)))
		h.Write(n[:])
		h.Write(f)
	}
	return h.Sum(nil)[:macSize]
}

func putUint64(b []byte, v uint64) {
	for i := range 8 {
		b[i] = byte(v >> (8 * i))
	}
}

func requestMAC(key []byte, id string, csr []byte) []byte {
	return mac(key, joinRequestMAC, []byte(id), csr)
}

func responseMAC(key []byte, id string, r *JoinResponse) []byte {
	return mac(key, joinResponseMAC, []byte(id), r.Cert, r.CA, r.Payload)
}

// Redeem answers a join request: it checks the token (known, unused, not
// expired), the MAC over the CSR and the CSR's own signature, marks the
// token used, and issues a certificate for the CSR's key naming the token's
// role and name (or, if the token names none, the CSR's subject CN). Only a
// device gets the DNS names and IP addresses of its CSR into its
// certificate. Errors: Kind Invalid (malformed), Permission (bad MAC,
// expired, used), NotFound (unknown token).
func (a *Authority) Redeem(ctx context.Context, req JoinRequest) (*JoinResponse, error) {
	const op = "join"
	if req.Format != joinFormat {
		return nil, cairn.E(op, cairn.Invalid, "", fmt.Errorf("join format %d, this node speaks %d", req.Format, joinFormat))
	}
	if len(req.Token) != 32 {
		return nil, cairn.E(op, cairn.Invalid, "", errors.New("malformed token ID"))
	}
	if _, err := hex.DecodeString(req.Token); err != nil || strings.ToLower(req.Token) != req.Token {
		return nil, cairn.E(op, cairn.Invalid, "", errors.New("malformed token ID"))
	}
	rec, err := a.Tokens.Get(ctx, req.Token)
	if err != nil {
		return nil, err
	}
	now := a.clock()
	if err = rec.usable(now); err != nil {
		return nil, err
	}
	if len(req.MAC) != macSize || subtle.ConstantTimeCompare(req.MAC, requestMAC(rec.MACKey, req.Token, req.CSR)) != 1 {
		a.log().Warn("join refused: bad MAC", "token", req.Token)
		return nil, cairn.E(op, cairn.Permission, req.Token, errors.New("join request not authenticated by the token"))
	}
	csr, err := x509.ParseCertificateRequest(req.CSR)
	if err != nil {
		return nil, cairn.E(op, cairn.Invalid, req.Token, fmt.Errorf("CSR: %w", err))
	}
	if err = csr.CheckSignature(); err != nil {
		return nil, cairn.E(op, cairn.Invalid, req.Token, fmt.Errorf("CSR signature: %w", err))
	}
	name := rec.Name
	if name == "" {
		name = csr.Subject.CommonName
		if err = ValidName(name); err != nil {
			return nil, cairn.E(op, cairn.Invalid, req.Token, fmt.Errorf("the token names no node and the joiner proposed %q: %w", name, err))
		}
	}
	id := NodeIdentity{Realm: a.CA.Realm, Name: name, Role: rec.Role}
	var o IssueOptions
	if rec.Role == Device {
		o.Hosts = append(o.Hosts, csr.DNSNames...)
		for _, ip := range csr.IPAddresses {
			o.Hosts = append(o.Hosts, ip.String())
		}
	}
	// Check that we can issue before burning the token.
	if err = id.Validate(); err != nil {
		return nil, err
	}
	rec, err = a.Tokens.Redeem(ctx, req.Token, name, now)
	if err != nil {
		return nil, err
	}
	cert, err := a.CA.Issue(csr.PublicKey, id, o)
	if err != nil {
		return nil, err
	}
	if a.Issued != nil {
		if err := a.Issued(ctx, id, cert); err != nil {
			return nil, err
		}
	}
	resp := &JoinResponse{Format: joinFormat, Cert: cert.Raw, CA: a.CA.Cert.Raw, Payload: rec.Payload}
	resp.MAC = responseMAC(rec.MACKey, req.Token, resp)
	a.log().Info("node joined", "token", req.Token, "node", name, "role", rec.Role, "serial", cert.SerialNumber.Text(16))
	return resp, nil
}

// JoinHandler serves POST JoinPath: a JoinRequest in, a JoinResponse out,
// both JSON; errors as {"kind": <cairn.Kind>, "msg": "..."} with an HTTP
// status (see doc/format.md).
func (a *Authority) JoinHandler() http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost {
			joinError(w, cairn.E("join", cairn.Invalid, "", errors.New("method not allowed")), http.StatusMethodNotAllowed)
			return
		}
		body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxJoinRequest))
		if err != nil {
			joinError(w, cairn.E("join", cairn.Invalid, "", fmt.Errorf("request body: %w", err)), 0)
			return
		}
		req, err := DecodeJoinRequest(body)
		if err != nil {
			joinError(w, err, 0)
			return
		}
		resp, err := a.Redeem(r.Context(), req)
		if err != nil {
			joinError(w, err, 0)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(resp)
	})
}

// DecodeJoinRequest parses a join request body strictly: one JSON object
// with only the known fields.
func DecodeJoinRequest(body []byte) (JoinRequest, error) {
	var req JoinRequest
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		return req, cairn.E("join", cairn.Invalid, "", fmt.Errorf("request: %w", err))
	}
	if dec.More() {
		return req, cairn.E("join", cairn.Invalid, "", errors.New("request: trailing data"))
	}
	return req, nil
}

type joinErrorBody struct {
	Kind cairn.Kind `json:"kind"`
	Msg  string     `json:"msg"`
}

func joinError(w http.ResponseWriter, err error, status int) {
	k := cairn.KindOf(err)
	if status == 0 {
		switch k {
		case cairn.Invalid:
			status = http.StatusBadRequest
		case cairn.Permission:
			status = http.StatusForbidden
		case cairn.NotFound:
			status = http.StatusNotFound
		case cairn.Canceled, cairn.Unavailable:
			status = http.StatusServiceUnavailable
		default:
			status = http.StatusInternalServerError
		}
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(joinErrorBody{Kind: k, Msg: err.Error()})
}

// JoinOptions tune Join.
type JoinOptions struct {
	// Name is the node name proposed to the realm; used only if the token
	// names none.
	Name string
	// Hosts are DNS names or IP addresses asked for in the certificate;
	// granted to a device only.
	Hosts []string
	// DialContext replaces net.Dialer's (tests, network namespaces).
	DialContext func(ctx context.Context, network, addr string) (net.Conn, error)
}

// Join redeems token at the join endpoint it names: it makes a new key pair
// (ECDSA P-256) and a CSR, authenticates the CSR with the token, and
// returns the node's credentials and, for a device, the opened payload. The
// endpoint must present a certificate chain that contains the CA whose
// fingerprint the token pins; any other CA (a man in the middle) is refused
// before a byte of the request is sent. The answer is authenticated with the
// token too.
func Join(ctx context.Context, token string, o JoinOptions) (*Credentials, []byte, error) {
	const op = "join"
	t, err := ParseToken(token)
	if err != nil {
		return nil, nil, err
	}
	if o.Name != "" {
		if err = ValidName(o.Name); err != nil {
			return nil, nil, err
		}
	}
	key, err := newKey()
	if err != nil {
		return nil, nil, cairn.E(op, cairn.Other, "", err)
	}
	tmpl := &x509.CertificateRequest{Subject: pkix.Name{CommonName: o.Name}}
	for _, h := range o.Hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if h != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	csr, err := x509.CreateCertificateRequest(rand.Reader, tmpl, key)
	if err != nil {
		return nil, nil, cairn.E(op, cairn.Invalid, "", err)
	}
	mk := t.MACKey()
	req := JoinRequest{Format: joinFormat, Token: t.IDString(), CSR: csr, MAC: requestMAC(mk[:], t.IDString(), csr)}
	body, err := json.Marshal(req)
	if err != nil {
		return nil, nil, cairn.E(op, cairn.Other, "", err)
	}

	client := &http.Client{Transport: joinTransport(t, o.DialContext), Timeout: defaultJoinTimeo}
	defer client.CloseIdleConnections()
	hreq, err := http.NewRequestWithContext(ctx, http.MethodPost, "https://"+t.Addr+JoinPath, bytes.NewReader(body))
	if err != nil {
		return nil, nil, cairn.E(op, cairn.Invalid, t.Addr, err)
	}
	hreq.Header.Set("Content-Type", "application/json")
	hresp, err := client.Do(hreq)
	if err != nil {
		if ctx.Err() != nil {
			return nil, nil, cairn.E(op, cairn.Canceled, t.Addr, ctx.Err())
		}
		var ve *tls.CertificateVerificationError
		var pe pinError
		if errors.As(err, &ve) || errors.As(err, &pe) {
			return nil, nil, cairn.E(op, cairn.Permission, t.Addr, err)
		}
		return nil, nil, cairn.E(op, cairn.Unavailable, t.Addr, err)
	}
	defer hresp.Body.Close()
	rb, err := io.ReadAll(io.LimitReader(hresp.Body, maxJoinResponse+1))
	if err != nil {
		return nil, nil, cairn.E(op, cairn.IO, t.Addr, err)
	}
	if len(rb) > maxJoinResponse {
		return nil, nil, cairn.E(op, cairn.Invalid, t.Addr, errors.New("join response too large"))
	}
	if hresp.StatusCode != http.StatusOK {
		var eb joinErrorBody
		if json.Unmarshal(rb, &eb) != nil || eb.Msg == "" {
			return nil, nil, cairn.E(op, cairn.Other, t.Addr, fmt.Errorf("join endpoint answered %s", hresp.Status))
		}
		return nil, nil, cairn.E(op, eb.Kind, t.Addr, errors.New(eb.Msg))
	}
	var resp JoinResponse
	if err := json.Unmarshal(rb, &resp); err != nil {
		return nil, nil, cairn.E(op, cairn.Invalid, t.Addr, fmt.Errorf("join response: %w", err))
	}
	return openJoinResponse(t, key, &resp)
}

// openJoinResponse checks a join response against the token and the
// joiner's key, and opens the payload.
func openJoinResponse(t Token, key crypto.Signer, resp *JoinResponse) (*Credentials, []byte, error) {
	const op = "join"
	fail := func(err error) (*Credentials, []byte, error) {
		return nil, nil, cairn.E(op, cairn.Permission, t.Addr, err)
	}
	mk := t.MACKey()
	if resp.Format != joinFormat || len(resp.MAC) != macSize ||
		subtle.ConstantTimeCompare(resp.MAC, responseMAC(mk[:], t.IDString(), resp)) != 1 {
		return fail(errors.New("join response not authenticated by the token"))
	}
	ca, err := x509.ParseCertificate(resp.CA)
	if err != nil {
		return fail(fmt.Errorf("CA certificate: %w", err))
	}
	if Fingerprint(ca) != t.CAFingerprint {
		return fail(errors.New("the realm CA differs from the one the token pins"))
	}
	leaf, err := x509.ParseCertificate(resp.Cert)
	if err != nil {
		return fail(fmt.Errorf("node certificate: %w", err))
	}
	if !publicKeyEqual(key.Public(), leaf.PublicKey) {
		return fail(errors.New("the certificate is not for this joiner's key"))
	}
	creds := &Credentials{Leaf: leaf, CA: ca, Key: key}
	if err = creds.check(); err != nil {
		return fail(err)
	}
	var payload []byte
	if len(resp.Payload) > 0 {
		if creds.Identity.Role != Device {
			return fail(fmt.Errorf("a %s must receive no payload", creds.Identity.Role))
		}
		if payload, err = openPayload(t, creds.Identity.Role, resp.Payload); err != nil {
			return fail(fmt.Errorf("payload: %w", err))
		}
	}
	return creds, payload, nil
}

// joinTransport is an HTTP/2 transport that accepts only a server whose
// presented chain holds the CA the token pins, and whose leaf that CA signed
// for a device of its realm.
func joinTransport(t Token, dial func(ctx context.Context, network, addr string) (net.Conn, error)) *http.Transport {
	var protos http.Protocols
	protos.SetHTTP2(true)
	tr := &http.Transport{
		Protocols:           &protos,
		DialContext:         dial,
		TLSHandshakeTimeout: 10 * time.Second,
		TLSClientConfig: &tls.Config{
			MinVersion:         tls.VersionTLS13,
			NextProtos:         []string{ALPN},
			InsecureSkipVerify: true, // verified against the pinned CA below
			VerifyConnection: func(cs tls.ConnectionState) error {
				if err := verifyPinned(cs.PeerCertificates, t.CAFingerprint); err != nil {
					return pinError{err}
				}
				return nil
			},
		},
	}
	if tr.DialContext == nil {
		tr.DialContext = (&net.Dialer{Timeout: 10 * time.Second}).DialContext
	}
	return tr
}

// pinError marks a join endpoint refused by verifyPinned.
type pinError struct{ error }

func (e pinError) Unwrap() error { return e.error }

// verifyPinned checks a presented server chain against a pinned CA
// fingerprint.
func verifyPinned(chain []*x509.Certificate, fp [32]byte) error {
	if len(chain) == 0 {
		return errors.New("cairn: join endpoint presented no certificate")
	}
	var ca *x509.Certificate
	for _, c := range chain[1:] {
		if Fingerprint(c) == fp {
			ca = c
		}
	}
	if ca == nil {
		return errors.New("cairn: join endpoint's CA is not the realm CA the token pins (man in the middle?)")
	}
	realm, err := caRealm(ca)
	if err != nil {
		return fmt.Errorf("cairn: pinned CA: %w", err)
	}
	if _, err := chain[0].Verify(x509.VerifyOptions{Roots: caPool(ca), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}); err != nil {
		return fmt.Errorf("cairn: join endpoint certificate: %w", err)
	}
	if _, err := Admit(realm, chain[0], NoRevocations{}); err != nil {
		return fmt.Errorf("cairn: join endpoint: %w", err)
	}
	if id, _ := IdentityOf(chain[0]); id.Role != Device {
		return fmt.Errorf("cairn: join endpoint is a %s, not a device", id.Role)
	}
	return nil
}
