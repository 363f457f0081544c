package natscluster

import "syscall"

// sysProcAttr has the kernel kill a server when the test binary dies
// without running its clean-ups (a -timeout panic, a SIGKILL), so no
// server outlives the test.
func sysProcAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
