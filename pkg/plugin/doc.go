// Package plugin owns the `kubectl ichor` command line: the cobra commands, their options
// (one struct per command with Complete, Validate and Run, as kubectl writes them, run by
// runCommand), the flags (kubectl's from k8s.io/cli-runtime, Talos' own), printing and
// exit codes. A command's Complete takes the factory, which builds its Kubernetes clients
// (from one REST config builder) and its one Talos connection on first use; Validate
// checks the flags without reaching the cluster. It writes only to the
// IOStreams it is given and never exits: Run returns the exit code for main.
//
// Exit codes: 0 when the command did what was asked (a plan with warnings included),
// 2 when a plan is refused by a check, 1 for any other error.
package plugin
