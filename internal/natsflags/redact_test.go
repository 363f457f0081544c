package natsflags

import "testing"

// TestRedact: user information is hidden, everything else kept.
func TestRedact(t *testing.T) {
	for in, want := range map[string]string{
		"nats://127.0.0.1:4222":                     "nats://127.0.0.1:4222",
		"nats://ops:pw@h:4222":                      "nats://ops:***@h:4222",
		"nats://tok@h:4222":                         "nats://***@h:4222",
		"tls://ops:p@ss@h:4222":                     "tls://ops:***@h:4222",
		"ops:pw@h:4222":                             "ops:***@h:4222",
		"nats://a:1@h1:1,nats://h2:2,nats://t@h3:3": "nats://a:***@h1:1,nats://h2:2,nats://***@h3:3",
		"ws://ops:pw@h:80/path@x":                   "ws://ops:***@h:80/path@x",
		"":                                          "",
	} {
		if got := Redact(in); got != want {
			t.Errorf("Redact(%q) = %q, want %q", in, got, want)
		}
	}
}
