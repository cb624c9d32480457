package objstore

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/http"
	"syscall"

	"cairn.dev/cairn/internal/cairn"
)

// HTTPKind classifies an HTTP status from an object store: 404 NotFound,
// 401 and 403 Permission, 408, 429 and 5xx Unavailable (retried), 409 and
// 412 Conflict, other 4xx Invalid, anything else Other.
func HTTPKind(status int) cairn.Kind {
	switch {
	case status == http.StatusNotFound:
		return cairn.NotFound
	case status == http.StatusUnauthorized || status == http.StatusForbidden:
		return cairn.Permission
	case status == http.StatusRequestTimeout || status == http.StatusTooManyRequests || status >= 500 && status < 600:
		return cairn.Unavailable
	case status == http.StatusConflict || status == http.StatusPreconditionFailed:
		return cairn.Conflict
	case status >= 400 && status < 500:
		return cairn.Invalid
	}
	return cairn.Other
}

// NetKind classifies an error that is not a reply from the server: a
// canceled context is Canceled; a connection that could not be made, was
// refused or reset, or timed out is Unavailable; one cut short while a
// reply was read is IO; a server certificate that does not verify is
// Permission. Anything else is Other.
func NetKind(err error) cairn.Kind {
	var (
		dns     *net.DNSError
		op      *net.OpError
		ne      net.Error
		unknown x509.UnknownAuthorityError
		invalid x509.CertificateInvalidError
		host    x509.HostnameError
		verify  *tls.CertificateVerificationError
	)
	switch {
	case err == nil:
		return cairn.Other
	case errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded):
		return cairn.Canceled
	case errors.As(err, &unknown) || errors.As(err, &invalid) || errors.As(err, &host) || errors.As(err, &verify):
		return cairn.Permission
	case errors.Is(err, syscall.ECONNREFUSED) || errors.Is(err, syscall.ECONNRESET) ||
		errors.Is(err, syscall.ECONNABORTED) || errors.Is(err, syscall.EPIPE) ||
		errors.Is(err, syscall.EHOSTUNREACH) || errors.Is(err, syscall.ENETUNREACH) ||
		errors.As(err, &dns) || errors.As(err, &op):
		return cairn.Unavailable
	case errors.As(err, &ne) && ne.Timeout():
		return cairn.Unavailable
	case errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF):
		return cairn.IO
	}
	return cairn.Other
}
