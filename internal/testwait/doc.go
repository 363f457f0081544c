// Package testwait holds the helpers tests share to wait for a condition
// with a deadline, and to find a free port. It imports nothing but the
// standard library, and not even package testing (the helpers take the
// small interface TB): tests of packages that must not link NATS (fallback)
// use it, and so do test-support packages that commands link.
//
// Every wait polls every Interval until its condition holds or its timeout
// passes, and checks the condition once more at the deadline: a test waits
// for a condition, never for a bare sleep. The helpers that take a
// testing.TB fail the test and must be called only from the test
// goroutine; Poll returns an error instead, for code that has no test at
// hand (a TestMain, a server's start).
package testwait
