// Package checks owns the pre-flight checks of a plan. Each check is a small type that
// reads a discovery.Snapshot (and, for removed APIs, the apiserver's metrics) and returns
// one result: OK, WARN (the plan can run; read this) or REFUSED (it cannot), with a
// one-line detail and what to do.
//
// Checks never change anything and never return an error: a check that cannot run says
// so in its result.
package checks
