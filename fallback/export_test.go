package fallback

import (
	"strconv"
	"time"
)

// ScriptSource pairs an embedded script's file name, source and the sha1
// the client will send with EVALSHA.
type ScriptSource struct{ Name, Src, Hash string }

// Scripts returns every embedded script.
func Scripts() []ScriptSource {
	out := make([]ScriptSource, 0, len(allScripts))
	for _, s := range allScripts {
		out = append(out, ScriptSource{s.name, s.src, s.Hash()})
	}
	return out
}

// KeysOf returns the Redis keys of the lock name under cfg.
func KeysOf(cfg *Config, name string) (lock, fence, queue, timeouts, readers string) {
	c, _ := cfg.withDefaults()
	k := c.keys(name)
	return k.lock, k.fence, k.queue, k.timeouts, k.readers
}

// ForgedLock returns a Lock of the plain mutex named key whose renewals
// (every ttl/3, to ttl) and release carry token instead of a token it drew:
// what a caller who guessed or forged another holder's token could do.
func ForgedLock(l *Locker, key, token string, ttl time.Duration) *Lock {
	k := l.c.cfg.keys(key)
	ops := tokenOps(l.c.nodes[0], k.lock, token, k.channel, strconv.FormatInt(ttl.Milliseconds(), 10))
	fl := newLock(key, 0, time.Now(), ttl, l.c.cfg.margin(ttl), true, ops, l.c.cfg.Logger)
	return fl
}
