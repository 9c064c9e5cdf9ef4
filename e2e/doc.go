// Package e2e holds the local-cluster tests. They are built with the e2e tag
// (make test runs them) and drive the built binaries as a user would: each
// test starts its own simulated cluster with $ICHOR_SIM (ichor-sim up) and
// runs $ICHOR_PLUGIN (kubectl-ichor) against it. The logs of a cluster whose
// test failed are kept under $ICHOR_E2E_ARTIFACTS.
//
// The simulator lives in e2e/sim and imports nothing from the product's pkg/
// tree, so a bug in the product cannot be mirrored there and cancel out.
package e2e
