// Package progress says how far an upgrade operation has come and how long
// it should still take: nodes done out of the plan's per stage, the time
// elapsed, and an estimate of the time left from the plan's critical path
// (stages in order, control planes one at a time, workers a batch at a
// time) fed with what the operation has measured so far.
package progress
