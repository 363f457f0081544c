//go:build !linux

package proctest

import "syscall"

func deathSignal() *syscall.SysProcAttr { return nil }
