// Package testcerts makes a throwaway PKI for tests: a CA, a server
// certificate for 127.0.0.1 and a client certificate, written as PEM
// files. It is for tests of TLS against real servers (redis-server,
// nats-server) only.
package testcerts

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// TB is the part of testing.TB the package uses.
type TB interface {
	Helper()
	Fatal(args ...any)
}

// PKI is a CA and two certificates it signed, as PEM file paths, and a
// pool holding the CA.
type PKI struct {
	CA                    string
	ServerCert, ServerKey string // for 127.0.0.1, server auth
	ClientCert, ClientKey string // client auth
	Pool                  *x509.CertPool
}

// New makes a PKI named name in dir (files <name>-ca.pem,
// <name>-server.pem, <name>-server-key.pem, <name>-client.pem,
// <name>-client-key.pem), valid from an hour ago to an hour from now.
func New(t TB, dir, name string) PKI {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name + " CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	p := PKI{CA: writePEM(t, dir, name+"-ca.pem", "CERTIFICATE", caDER), Pool: x509.NewCertPool()}
	p.Pool.AddCert(ca)
	leaf := func(serial int64, cn string, usage x509.ExtKeyUsage, ips []net.IP) (cert, key string) {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: cn},
			NotBefore: now.Add(-time.Hour), NotAfter: now.Add(time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage}, IPAddresses: ips,
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, ca, &k.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kder, err := x509.MarshalECPrivateKey(k)
		if err != nil {
			t.Fatal(err)
		}
		return writePEM(t, dir, name+"-"+cn+".pem", "CERTIFICATE", der), writePEM(t, dir, name+"-"+cn+"-key.pem", "EC PRIVATE KEY", kder)
	}
	p.ServerCert, p.ServerKey = leaf(2, "server", x509.ExtKeyUsageServerAuth, []net.IP{net.ParseIP("127.0.0.1")})
	p.ClientCert, p.ClientKey = leaf(3, "client", x509.ExtKeyUsageClientAuth, nil)
	return p
}

func writePEM(t TB, dir, name, typ string, der []byte) string {
	t.Helper()
	path := filepath.Join(dir, name)
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
	return path
}
