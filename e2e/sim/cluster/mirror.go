package cluster

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"

	"github.com/ichor-dev/kubectl-ichor/e2e/sim/machine"
)

// MirrorCAFile is the CA (PEM) the mirror's certificate is signed by, in the
// cluster's directory: a client of the mirror trusts it (SSL_CERT_FILE), as an
// operator's machine trusts a private registry's CA.
const MirrorCAFile = "mirror-ca.pem"

// serveMirror serves the cluster's mirror over TLS on its address, with a
// certificate of the cluster's CA for it, until ctx ends.
func serveMirror(ctx context.Context, dir string, m *machine.Mirror, ca *ca, addr netip.Addr) error {
	cert, err := ca.issue("mirror", nil, []net.IP{addr.AsSlice()}, nil, true, false)
	if err != nil {
		return fmt.Errorf("mirror: %w", err)
	}
	pair, err := tls.X509KeyPair(cert.CertPEM, cert.KeyPEM)
	if err != nil {
		return fmt.Errorf("mirror: %w", err)
	}
	if err := os.WriteFile(filepath.Join(dir, MirrorCAFile), ca.certPEM, 0o644); err != nil {
		return err
	}
	l, err := net.Listen("tcp", m.Host)
	if err != nil {
		return fmt.Errorf("mirror: %w", err)
	}
	roots := x509.NewCertPool()
	roots.AddCert(ca.cert)
	push := &http.Transport{TLSClientConfig: &tls.Config{RootCAs: roots, MinVersion: tls.VersionTLS12}}
	return m.Serve(ctx, tls.NewListener(l, &tls.Config{Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}), push)
}
