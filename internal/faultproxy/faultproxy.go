// Package faultproxy puts a TCP fault proxy between a test's NATS clients
// and a nats-server, so a test can cut, reset, slow or stall one process's
// connection while the server and everyone else carry on.
//
// It runs Shopify's toxiproxy in-process, as a library: a Proxy listens on
// a loopback port of its own (the same port across Cut and Restore, so a
// client that reconnects to its URL finds it again) and copies bytes to the
// upstream through toxiproxy's toxics. Nothing listens for toxiproxy's HTTP
// API.
package faultproxy

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	toxiproxy "github.com/Shopify/toxiproxy/v2"
	"github.com/rs/zerolog"
)

// Direction says which way a toxic acts: Downstream is server to client
// (what the client reads), Upstream is client to server.
type Direction string

const (
	Downstream Direction = "downstream"
	Upstream   Direction = "upstream"
)

// Proxy is one proxied upstream. Its methods are safe for concurrent use.
type Proxy struct {
	mu     sync.Mutex
	p      *toxiproxy.Proxy
	addr   string
	n      int // names toxics
	closed bool
}

// New starts a proxy on 127.0.0.1 (a free port) in front of upstream
// ("host:port", or a nats:// URL).
func New(upstream string) (*Proxy, error) {
	upstream = strings.TrimPrefix(upstream, "nats://")
	srv := toxiproxy.NewServer(toxiproxy.NewMetricsContainer(nil), zerolog.Nop())
	tp := toxiproxy.NewProxy(srv, "nats", "127.0.0.1:0", upstream)
	if err := tp.Start(); err != nil {
		return nil, fmt.Errorf("faultproxy: %w", err)
	}
	tp.Lock()
	addr := tp.Listen // the port the listener got
	tp.Unlock()
	return &Proxy{p: tp, addr: addr}, nil
}

// Addr returns the proxy's "host:port".
func (p *Proxy) Addr() string { return p.addr }

// URL returns the proxy's address as a NATS URL.
func (p *Proxy) URL() string { return "nats://" + p.addr }

// Cut closes every connection through the proxy and refuses new ones until
// Restore: to both ends it looks like the network went away. Bytes the
// proxy had read from one side and not yet written to the other are lost,
// which is what a real cut does to data in flight. Cutting a cut proxy
// does nothing.
func (p *Proxy) Cut() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.p.Stop()
}

// Restore accepts connections again, on the same address.
func (p *Proxy) Restore() error {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return errors.New("faultproxy: closed")
	}
	p.p.Lock()
	enabled := p.p.Enabled
	p.p.Unlock()
	if enabled {
		return nil
	}
	// The port is free again only once the old listener is closed, which
	// Cut waited for; someone else may still take it in between, hence
	// the retries.
	var err error
	for range 50 {
		if err = p.p.Start(); err == nil {
			return nil
		}
		time.Sleep(20 * time.Millisecond)
	}
	return fmt.Errorf("faultproxy: restore on %s: %w", p.addr, err)
}

// Toxic is a fault added to the proxy; Remove takes it away again.
type Toxic struct {
	p    *Proxy
	name string
}

// Remove takes the toxic off the proxy. Removing it twice is harmless.
//
// Remove blocks while the toxic holds data of connections that are dying:
// toxiproxy tries to flush it, giving up on each chunk after 5s. After a
// Cut, let a latency pass before removing its toxic (a cut connection's
// toxics let go of their data within the latency), or remove it after
// Restore.
func (t *Toxic) Remove() {
	_ = t.p.p.Toxics.RemoveToxic(context.Background(), t.name)
}

// add adds a toxic of typ with the given attributes (JSON) on dir, for
// every connection now and later.
func (p *Proxy) add(typ string, dir Direction, attrs string) (*Toxic, error) {
	p.mu.Lock()
	p.n++
	name := fmt.Sprintf("%s_%s_%d", typ, dir, p.n)
	p.mu.Unlock()
	body := fmt.Sprintf(`{"name":%q,"type":%q,"stream":%q,"toxicity":1,"attributes":%s}`, name, typ, dir, attrs)
	if _, err := p.p.Toxics.AddToxicJson(strings.NewReader(body)); err != nil {
		return nil, fmt.Errorf("faultproxy: add %s: %w", typ, err)
	}
	return &Toxic{p: p, name: name}, nil
}

// Latency delays every chunk of data going dir by latency ± jitter.
//
// Do not Cut while a latency or bandwidth toxic holds data: toxiproxy
// v2.5.0 then leaves the toxic's goroutine blocked for good, sending to a
// link whose writer is gone. To lose data in flight, swallow it with
// Timeout and then Cut.
func (p *Proxy) Latency(dir Direction, latency, jitter time.Duration) (*Toxic, error) {
	return p.add("latency", dir, fmt.Sprintf(`{"latency":%d,"jitter":%d}`, latency.Milliseconds(), jitter.Milliseconds()))
}

// Bandwidth limits data going dir to kbps kilobytes per second.
func (p *Proxy) Bandwidth(dir Direction, kbps int64) (*Toxic, error) {
	return p.add("bandwidth", dir, fmt.Sprintf(`{"rate":%d}`, kbps))
}

// Timeout stops all data going dir; connections are closed after d, or
// held open and silent until the toxic is removed if d is zero. Data sent
// meanwhile is dropped.
func (p *Proxy) Timeout(dir Direction, d time.Duration) (*Toxic, error) {
	return p.add("timeout", dir, fmt.Sprintf(`{"timeout":%d}`, d.Milliseconds()))
}

// ResetPeer resets connections (TCP RST where the toxic was in place when
// the connection opened, a close otherwise) once data goes dir, after
// after. It stays until removed: new connections are reset too.
func (p *Proxy) ResetPeer(dir Direction, after time.Duration) (*Toxic, error) {
	return p.add("reset_peer", dir, fmt.Sprintf(`{"timeout":%d}`, after.Milliseconds()))
}

// Close stops the proxy for good and closes every connection through it.
func (p *Proxy) Close() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed {
		return
	}
	p.closed = true
	// Toxics first, while the connections are alive to take their data;
	// see Toxic.Remove.
	p.p.Toxics.ResetToxics(context.Background())
	p.p.Stop()
}
