package redistest

import (
	"bytes"
	"net"
	"sync"
	"sync/atomic"
)

// Proxy forwards TCP connections to a server. Armed with CutAfter, it lets
// the next client write that contains a marker reach the server, waits for
// the server's reply, throws the reply away and closes the connection: the
// command ran, the client never learns it did.
type Proxy struct {
	Addr   string
	target string
	ln     net.Listener

	mu     sync.Mutex
	marker []byte
	cuts   int
	conns  map[net.Conn]struct{}
	wg     sync.WaitGroup
}

// NewProxy listens on a free port of 127.0.0.1 and forwards to target.
func NewProxy(target string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	p := &Proxy{Addr: ln.Addr().String(), target: target, ln: ln, conns: make(map[net.Conn]struct{})}
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// CutAfter arms the proxy once for marker (e.g. "evalsha").
func (p *Proxy) CutAfter(marker string) {
	p.mu.Lock()
	p.marker = []byte(marker)
	p.mu.Unlock()
}

// Cuts reports how many connections were cut.
func (p *Proxy) Cuts() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.cuts
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		s, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		p.conns[c], p.conns[s] = struct{}{}, struct{}{}
		p.mu.Unlock()
		var swallow atomic.Bool
		p.wg.Add(2)
		go p.upstream(c, s, &swallow)
		go p.downstream(c, s, &swallow)
	}
}

// upstream copies client to server. When armed, a write that contains the
// marker sets swallow before it goes on to the server: the server's next
// reply is then thrown away by downstream.
func (p *Proxy) upstream(c, s net.Conn, swallow *atomic.Bool) {
	defer p.wg.Done()
	defer s.Close()
	defer c.Close()
	buf := make([]byte, 64<<10)
	for {
		n, err := c.Read(buf)
		if n > 0 {
			p.mu.Lock()
			if p.marker != nil && bytes.Contains(bytes.ToLower(buf[:n]), bytes.ToLower(p.marker)) {
				p.marker = nil
				p.cuts++
				swallow.Store(true)
			}
			p.mu.Unlock()
			// The whole command goes on, even if it spans several reads:
			// the cut happens on the reply side, once the server answered,
			// so the command has run (a cut of the request side could
			// leave it half sent, and not run at all).
			if _, werr := s.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// downstream copies server to client. Once swallow is set, the server's
// reply — proof that the command ran — is dropped and both sides closed:
// the client never learns the command ran.
func (p *Proxy) downstream(c, s net.Conn, swallow *atomic.Bool) {
	defer p.wg.Done()
	defer s.Close()
	defer c.Close()
	buf := make([]byte, 64<<10)
	for {
		n, err := s.Read(buf)
		if n > 0 {
			if swallow.Load() {
				return
			}
			if _, werr := c.Write(buf[:n]); werr != nil {
				return
			}
		}
		if err != nil {
			return
		}
	}
}

// Close stops the proxy and every connection through it, and waits.
func (p *Proxy) Close() error {
	err := p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
	return err
}
