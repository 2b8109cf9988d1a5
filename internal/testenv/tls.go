package testenv

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// testCA is a throwaway certificate authority and a server certificate it
// signed for 127.0.0.1, written as PEM files into dir.
type testCA struct {
	caFile, certFile, keyFile string
	pool                      *x509.CertPool
}

func newTestCA(dir string) (*testCA, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "starlease test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:    x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return nil, err
	}
	ca := &testCA{caFile: filepath.Join(dir, "ca.pem"), certFile: filepath.Join(dir, "server.pem"),
		keyFile: filepath.Join(dir, "server-key.pem"), pool: x509.NewCertPool()}
	ca.pool.AddCert(caCert)
	for _, f := range []struct {
		path, kind string
		der        []byte
	}{{ca.caFile, "CERTIFICATE", caDER}, {ca.certFile, "CERTIFICATE", der}, {ca.keyFile, "EC PRIVATE KEY", keyDER}} {
		if err := os.WriteFile(f.path, pem.EncodeToMemory(&pem.Block{Type: f.kind, Bytes: f.der}), 0o600); err != nil {
			return nil, err
		}
	}
	return ca, nil
}

// CAFile is the PEM file of the server's test CA ("" without TLS).
func (r *Redis) CAFile() string {
	if r.ca == nil {
		return ""
	}
	return r.ca.caFile
}

// ClientTLS is a client configuration that trusts only the server's test
// CA (nil for a server without TLS).
func (r *Redis) ClientTLS() *tls.Config {
	if r.ca == nil {
		return nil
	}
	return &tls.Config{RootCAs: r.ca.pool, MinVersion: tls.VersionTLS12}
}
