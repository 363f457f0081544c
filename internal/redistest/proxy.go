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
	hold   bool // the armed marker holds, not cuts
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
	p.marker, p.hold = []byte(marker), false
	p.mu.Unlock()
}

// HoldAfter arms the proxy once for marker like CutAfter, but holds the
// connection instead of closing it: the command reaches the server, and
// from then on nothing the server sends reaches the client, which waits
// for a reply that never comes (a server that stopped answering), until
// the proxy is closed. Cuts counts it.
func (p *Proxy) HoldAfter(marker string) {
	p.mu.Lock()
	p.marker, p.hold = []byte(marker), true
	p.mu.Unlock()
}

// Swallow states of a connection.
const (
	passing int32 = iota
	cutting       // drop the reply and close
	holding       // drop every reply, keep the connection open
)

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
		var swallow atomic.Int32
		p.wg.Add(2)
		go p.upstream(c, s, &swallow)
		go p.downstream(c, s, &swallow)
	}
}

// upstream copies client to server. When armed, a write that contains the
// marker sets swallow before it goes on to the server: the server's next
// reply is then thrown away by downstream.
func (p *Proxy) upstream(c, s net.Conn, swallow *atomic.Int32) {
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
				if p.hold {
					swallow.Store(holding)
				} else {
					swallow.Store(cutting)
				}
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
func (p *Proxy) downstream(c, s net.Conn, swallow *atomic.Int32) {
	defer p.wg.Done()
	defer s.Close()
	defer c.Close()
	buf := make([]byte, 64<<10)
	for {
		n, err := s.Read(buf)
		if n > 0 {
			switch swallow.Load() {
			case cutting:
				return
			case holding:
				continue
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
