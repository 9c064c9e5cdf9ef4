// Package soak is the fault soak's model, apart from any cluster: the seeded
// schedule of a run (its cluster's shape, its upgrade, its faults and when
// they come and go), the independent checker that judges a run from what the
// simulator recorded (events.jsonl) and what the operator saw (the pauses of
// `kubectl ichor status -o json`, the cluster at the end), and the report
// (to come with the driver: _output/soak/, one JSON per run and summary.json).
//
// The driver that runs these schedules against local clusters through the e2e
// framework (a test under the e2e and soak build tags, make soak; issue 27) is
// not written yet: today this package is the model and its unit tests.
//
// Like the simulator, this package imports nothing from the product's pkg/
// tree: a bug in the product cannot be mirrored in its judge. A run's schedule
// is a pure function of its seed, so a broken run is replayed by its seed
// alone.
package soak
