// Package soak is the fault soak's model, apart from any cluster: the seeded
// schedule of a run (its cluster's shape, its upgrade, its faults and when
// they come and go), the independent checker that judges a run from what the
// simulator recorded (events.jsonl) and what the operator saw (the pauses of
// `kubectl ichor status -o json`, the cluster at the end).
//
// The driver that runs these schedules against local clusters is TestSoak in
// package e2e (e2e/soak_test.go, under the e2e and soak build tags; make soak,
// hack/soak.sh), which writes the report to _output/soak/: one JSON per run
// and summary.json.
//
// Like the simulator, this package imports nothing from the product's pkg/
// tree: a bug in the product cannot be mirrored in its judge. A run's schedule
// is a pure function of its seed, so a broken run is replayed by its seed
// alone.
package soak
