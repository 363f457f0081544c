package natsflags

import "strings"

// Redact returns a NATS URL list (comma-separated, as --nats takes it)
// fit to print: the user information of each URL is replaced by
// "user:***" when it holds a password, and by "***" when it is a token
// (nats://TOKEN@host) or anything else. A URL without one is unchanged.
// Every error and log line that names a URL a user gave goes through it:
// a password must not end up in a terminal's scroll-back, a CI log or a
// ticket.
func Redact(urls string) string {
	parts := strings.Split(urls, ",")
	for i, p := range parts {
		parts[i] = redactOne(p)
	}
	return strings.Join(parts, ",")
}

func redactOne(u string) string {
	rest, scheme := u, ""
	if i := strings.Index(u, "://"); i >= 0 {
		scheme, rest = u[:i+3], u[i+3:]
	}
	// The user information ends at the last '@' before the path.
	host := rest
	if i := strings.IndexAny(rest, "/?#"); i >= 0 {
		host = rest[:i]
	}
	at := strings.LastIndex(host, "@")
	if at < 0 {
		return u
	}
	info := rest[:at]
	if user, _, ok := strings.Cut(info, ":"); ok && user != "" {
		return scheme + user + ":***" + rest[at:]
	}
	return scheme + "***" + rest[at:]
}
