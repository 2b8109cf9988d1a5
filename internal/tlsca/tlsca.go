// Package tlsca builds the TLS client configuration the network backends
// share: trust only the CA certificates of one PEM file, verify always.
package tlsca

import (
	"crypto/tls"
	"crypto/x509"
	"os"

	"github.com/starintel/starlease/lease"
)

// FromFile is a client configuration trusting only the CA certificates of
// the PEM file; serverName overrides the name the certificate must hold
// (empty: the dialed host).
func FromFile(file, serverName string) (*tls.Config, error) {
	pem, err := os.ReadFile(file)
	if err != nil {
		return nil, lease.Invalid("tls_ca_file", "cannot read the file")
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pem) {
		return nil, lease.Invalid("tls_ca_file", "holds no PEM certificate")
	}
	return &tls.Config{RootCAs: pool, ServerName: serverName, MinVersion: tls.VersionTLS12}, nil
}
