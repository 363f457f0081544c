package fallback

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
