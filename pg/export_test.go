package keylanepg

// WholeError is Applier.ApplyGroup's mapping of a whole group's error,
// for the tests' appliers that call Apply themselves.
var WholeError = wholeError
