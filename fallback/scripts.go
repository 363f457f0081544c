package fallback

import (
	"context"
	_ "embed"
	"strings"

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
	if err != nil && refused(err) {
		return v, refusedBy(c, err)
	}
	return v, err
}

// refused reports a Redis error that proves the command did not run
// because of who the client is: a wrong or missing password, or an ACL
// user without the command, key or channel. Redis 7 reports a command a
// script may not run as a plain ERR, recognised by its text (go-redis'
// HasErrorPrefix skips the "ERR ").
func refused(err error) bool {
	return redis.IsAuthError(err) || redis.IsPermissionError(err) ||
		redis.HasErrorPrefix(err, "The user executing the script can't run")
}

// refusedBy names the server and the user of c in a *RefusedError.
func refusedBy(c redis.Scripter, err error) error {
	e := &RefusedError{Err: err, InScript: redis.HasErrorPrefix(err, "The user executing the script can't run")}
	switch c := c.(type) {
	case *redis.Client:
		e.Addr, e.User = c.Options().Addr, c.Options().Username
	case *redis.ClusterClient:
		e.Addr, e.User = strings.Join(c.Options().Addrs, ","), c.Options().Username
	}
	return e
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
