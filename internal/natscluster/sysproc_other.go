//go:build !linux

package natscluster

import "syscall"

func sysProcAttr() *syscall.SysProcAttr { return nil }
