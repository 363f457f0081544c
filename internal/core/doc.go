// Package core is keylane's shared vocabulary, the leaf every room of the
// engine imports: Job and the Handler that runs one, the errors keylane
// returns, and the defaults and limits of its configurations. Package
// keylane re-exports each exported name as an alias (as River's rivertype
// does), so a caller never imports core and errors.Is sees one value
// whichever package returned it.
//
// core imports only package wire (whose door errors it shares) and the
// standard library; nothing here talks to NATS.
package core
