package pki

import (
	"crypto"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"io/fs"
	"os"

	"cairn.dev/cairn/internal/cairn"
)

func encodeCert(c *x509.Certificate) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: c.Raw})
}

func encodeKey(k crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(k)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

// readPEM reads the one PEM block of type typ in path. Kind NotFound when the
// file is missing, Corrupt when it does not hold such a block.
func readPEM(path, typ string) ([]byte, error) {
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, cairn.E("read", cairn.NotFound, path, err)
	}
	if err != nil {
		return nil, cairn.E("read", cairn.IO, path, err)
	}
	blk, _ := pem.Decode(b)
	if blk == nil || blk.Type != typ {
		return nil, cairn.E("read", cairn.Corrupt, path, fmt.Errorf("no PEM block of type %s", typ))
	}
	return blk.Bytes, nil
}

func readCert(path string) (*x509.Certificate, error) {
	der, err := readPEM(path, "CERTIFICATE")
	if err != nil {
		return nil, err
	}
	c, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, cairn.E("read", cairn.Corrupt, path, err)
	}
	return c, nil
}

func readKey(path string) (crypto.Signer, error) {
	if fi, err := os.Stat(path); err == nil && fi.Mode().Perm()&0o077 != 0 {
		return nil, cairn.E("read", cairn.Permission, path, fmt.Errorf("key file has mode %v; want 0600", fi.Mode().Perm()))
	}
	der, err := readPEM(path, "PRIVATE KEY")
	if err != nil {
		return nil, err
	}
	k, err := x509.ParsePKCS8PrivateKey(der)
	if err != nil {
		return nil, cairn.E("read", cairn.Corrupt, path, err)
	}
	s, ok := k.(crypto.Signer)
	if !ok {
		return nil, cairn.E("read", cairn.Corrupt, path, fmt.Errorf("key of type %T cannot sign", k))
	}
	return s, nil
}

func publicKeyEqual(a, b crypto.PublicKey) bool {
	ea, ok := a.(interface{ Equal(crypto.PublicKey) bool })
	return ok && ea.Equal(b)
}
