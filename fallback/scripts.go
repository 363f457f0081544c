package fallback

import (
	"context"
	_ "embed"

	"github.com/redis/go-redis/v9"
)

// script is one embedded Lua file. It is run with EVALSHA, falling back to
// EVAL only on NOSCRIPT, which proves the first call did not run.
type script struct {
	name string
	src  string
	*redis.Script
}

func newScript(name, src string) *script {
	return &script{name: name, src: src, Script: redis.NewScript(src)}
}

var (
	//go:embed scripts/acquire.lua
	acquireSrc string
	//go:embed scripts/release.lua
	releaseSrc string
	//go:embed scripts/renew.lua
	renewSrc string
	//go:embed scripts/reentrant_acquire.lua
	reentrantAcquireSrc string
	//go:embed scripts/reentrant_release.lua
	reentrantReleaseSrc string
	//go:embed scripts/reentrant_renew.lua
	reentrantRenewSrc string
	//go:embed scripts/fair_acquire.lua
	fairAcquireSrc string
	//go:embed scripts/fair_cancel.lua
	fairCancelSrc string
	//go:embed scripts/read_acquire.lua
	readAcquireSrc string
	//go:embed scripts/read_renew.lua
	readRenewSrc string
	//go:embed scripts/read_release.lua
	readReleaseSrc string
	//go:embed scripts/write_acquire.lua
	writeAcquireSrc string
	//go:embed scripts/fence_raise.lua
	fenceRaiseSrc string

	acquireScript          = newScript("acquire.lua", acquireSrc)
	releaseScript          = newScript("release.lua", releaseSrc)
	renewScript            = newScript("renew.lua", renewSrc)
	reentrantAcquireScript = newScript("reentrant_acquire.lua", reentrantAcquireSrc)
	reentrantReleaseScript = newScript("reentrant_release.lua", reentrantReleaseSrc)
	reentrantRenewScript   = newScript("reentrant_renew.lua", reentrantRenewSrc)
	fairAcquireScript      = newScript("fair_acquire.lua", fairAcquireSrc)
	fairCancelScript       = newScript("fair_cancel.lua", fairCancelSrc)
	readAcquireScript      = newScript("read_acquire.lua", readAcquireSrc)
	readRenewScript        = newScript("read_renew.lua", readRenewSrc)
	readReleaseScript      = newScript("read_release.lua", readReleaseSrc)
	writeAcquireScript     = newScript("write_acquire.lua", writeAcquireSrc)
	fenceRaiseScript       = newScript("fence_raise.lua", fenceRaiseSrc)

	allScripts = []*script{
		acquireScript, releaseScript, renewScript,
		reentrantAcquireScript, reentrantReleaseScript, reentrantRenewScript,
		fairAcquireScript, fairCancelScript,
		readAcquireScript, readRenewScript, readReleaseScript, writeAcquireScript,
		fenceRaiseScript,
	}
)

// run executes s once. It never resends a script that may have run: the
// only second send is EVAL after a NOSCRIPT reply.
func (s *script) run(ctx context.Context, c redis.Scripter, keys []string, args ...any) (any, error) {
	v, err := c.EvalSha(ctx, s.Hash(), keys, args...).Result()
	if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		v, err = c.Eval(ctx, s.src, keys, args...).Result()
	}
	return v, err
}

// acquireReply decodes {1, fence} or {0, pttl}.
func acquireReply(v any) (ok bool, n int64, err error) {
	a, isSlice := v.([]any)
	if !isSlice || len(a) != 2 {
		return false, 0, errUnexpected(v)
	}
	flag, ok1 := a[0].(int64)
	num, ok2 := a[1].(int64)
	if !ok1 || !ok2 {
		return false, 0, errUnexpected(v)
	}
	return flag == 1, num, nil
}
