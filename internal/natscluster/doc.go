// Package natscluster runs a real NATS cluster with JetStream for tests:
// nats-server processes, built from the nats-server module version in
// go.mod (Binary), on free loopback ports, each with its own store,
// routed to each other.
//
// Processes, not in-process servers, so a test can do to a node what
// production does: SIGKILL it (Node.Kill: unsynced writes are lost),
// SIGTERM it (Stop), SIGSTOP it (Pause: it holds its sockets and answers
// nothing), and start it again on the same ports and store (Restart).
//
// Leaders are read where the server publishes them: the meta leader from
// every node's monitoring endpoint (/jsz; all must agree), a stream's or
// consumer's from its info ($JS.API.STREAM.INFO, CONSUMER.INFO). The
// step-downs are the JetStream API requests; the meta one is a system
// account request, so each node's configuration has a system account
// user next to the application account, and clients that give no
// credentials are the application user (no_auth_user): URLs carries no
// secrets.
//
// A proxied link (Options.ProxiedLinks, Link) puts fault proxies on every
// route connection between two nodes, pooled and per-account ones
// included, so a test can delay what one sends the other. Each route
// must be a configured one: nats-server also dials, from gossip, the
// route address a peer advertises, and no one address is right for every
// peer of a node in a link (the proxy is wrong for a third node, the
// node's own address for its partner). So with links every node
// advertises an address that refuses connections, and Launch checks each
// node's /routez (CheckRoutes): a route of the pair around its proxies,
// or a third node's through them, fails the start, and a test that
// relies on the delay can check again after it.
//
// Every wait has a deadline (the caller's context, or a fixed bound on
// the few calls without one); every process is killed when the test
// ends, and on Linux also when the test binary dies without cleaning up
// (Pdeathsig).
package natscluster
