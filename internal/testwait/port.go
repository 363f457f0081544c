package testwait

import "net"

// FreePort returns a loopback TCP port that was free a moment ago, or fails
// the test. Another process may take it before the caller binds it; a
// server that can pick its own port (nats-server's Port -1) should.
func FreePort(t TB) int {
	t.Helper()
	ports, err := FreePorts(1)
	if err != nil {
		t.Fatalf("free port: %v", err)
	}
	return ports[0]
}

// FreePorts returns n distinct loopback TCP ports that were free a moment
// ago: it holds each one open until it has them all, so none is handed out
// twice.
func FreePorts(n int) ([]int, error) {
	ports := make([]int, n)
	for i := range ports {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		defer l.Close()
		ports[i] = l.Addr().(*net.TCPAddr).Port
	}
	return ports, nil
}
