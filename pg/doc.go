// Package keylanepg applies keylane jobs to a PostgreSQL database, exactly
// once and group-committed. (Protocol notes to follow.)
package keylanepg
