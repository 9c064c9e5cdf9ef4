package talosapi

import (
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"time"

	"github.com/siderolabs/talos/pkg/machinery/role"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"

	"github.com/ichor-dev/kubectl-ichor/e2e/sim/machine"
)

// serverCertValidity is how long the generated server certificates are valid.
const serverCertValidity = 365 * 24 * time.Hour

// authority is the Talos OS CA that signs server certificates and verifies
// client certificates.
type authority struct {
	cert *x509.Certificate
	key  crypto.Signer
	pool *x509.CertPool
}

func parseAuthority(certPEM, keyPEM []byte) (*authority, error) {
	block, _ := pem.Decode(certPEM)
	if block == nil {
		return nil, errors.New("CA certificate: no PEM block")
	}
	cert, err := x509.ParseCertificate(block.Bytes)
	if err != nil {
		return nil, fmt.Errorf("CA certificate: %w", err)
	}
	key, err := parsePrivateKey(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("CA key: %w", err)
	}
	pool := x509.NewCertPool()
	pool.AddCert(cert)
	return &authority{cert: cert, key: key, pool: pool}, nil
}

// parsePrivateKey reads a PEM private key as the Talos secrets bundle writes
// it (Ed25519 as PKCS#8 in an "ED25519 PRIVATE KEY" block, EC, RSA).
func parsePrivateKey(keyPEM []byte) (crypto.Signer, error) {
	block, _ := pem.Decode(keyPEM)
	if block == nil {
		return nil, errors.New("no PEM block")
	}
	var (
		key any
		err error
	)
	switch block.Type {
	case "EC PRIVATE KEY":
		key, err = x509.ParseECPrivateKey(block.Bytes)
	case "RSA PRIVATE KEY":
		key, err = x509.ParsePKCS1PrivateKey(block.Bytes)
	default: // "PRIVATE KEY", "ED25519 PRIVATE KEY": PKCS#8
		key, err = x509.ParsePKCS8PrivateKey(block.Bytes)
	}
	if err != nil {
		return nil, fmt.Errorf("parse %s: %w", block.Type, err)
	}
	signer, ok := key.(crypto.Signer)
	if !ok {
		return nil, fmt.Errorf("%s is not a signing key", block.Type)
	}
	return signer, nil
}

// serverTLS returns the TLS config of a machine's endpoint: its own server
// certificate, client certificates required and verified against the CA.
func (a *authority) serverTLS(m *machine.Machine) (*tls.Config, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, fmt.Errorf("server key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, fmt.Errorf("serial: %w", err)
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: m.Name(), Organization: []string{"talos"}},
		DNSNames:     []string{m.Name(), "talos.default", "localhost"},
		IPAddresses:  []net.IP{net.IP(m.IP().AsSlice()), net.IPv4(127, 0, 0, 1)},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(serverCertValidity),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, a.cert, &key.PublicKey, a.key)
	if err != nil {
		return nil, fmt.Errorf("sign server certificate for %s: %w", m.Name(), err)
	}
	return &tls.Config{
		Certificates: []tls.Certificate{{Certificate: [][]byte{der}, PrivateKey: key}},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    a.pool,
		MinVersion:   tls.VersionTLS12,
		NextProtos:   []string{"h2"},
	}, nil
}

// rolesFromContext returns the roles of the caller: the Organization of its
// verified client certificate, as Talos reads them.
func rolesFromContext(ctxPeer *peer.Peer) role.Set {
	if ctxPeer == nil {
		return role.MakeSet()
	}
	info, ok := ctxPeer.AuthInfo.(credentials.TLSInfo)
	if !ok || len(info.State.VerifiedChains) == 0 || len(info.State.VerifiedChains[0]) == 0 {
		return role.MakeSet()
	}
	roles, _ := role.Parse(info.State.VerifiedChains[0][0].Subject.Organization)
	return roles
}
