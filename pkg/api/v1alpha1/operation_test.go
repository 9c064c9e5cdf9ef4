package v1alpha1

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

var t0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func TestRunnerRecords(t *testing.T) {
	var s OperationStatus

	s.StartRunner("pod-1", "worker-1", false, t0, t0.Add(2*time.Second))
	s.EndRunner(t0.Add(10 * time.Second))
	s.StartRunner("pod-2", "cp-1", false, t0, t0.Add(21*time.Second))

	// A runner that died without a word: idle since the last write.
	updated := metav1.NewTime(t0.Add(30 * time.Second))
	s.UpdatedAt = &updated
	s.StartRunner("pod-3", "cp-2", true, t0, t0.Add(40*time.Second))

	require.Len(t, s.Runners, 3)
	assert.Equal(t, t0, s.Runners[0].Idle.Time, "the first runner waited from the launch")
	assert.Equal(t, t0.Add(10*time.Second), s.Runners[1].Idle.Time, "the next from the previous one's end")
	assert.Equal(t, t0.Add(30*time.Second), s.Runners[2].Idle.Time, "or from its last write")
	assert.True(t, s.Runners[2].AfterPause)

	// The first runner waits from the launch to the microsecond when known.
	launched := metav1.NewMicroTime(t0.Add(300 * time.Millisecond))
	fresh := OperationStatus{LaunchedAt: &launched}
	fresh.StartRunner("pod-1", "worker-1", false, t0, t0.Add(2*time.Second))
	assert.Equal(t, launched.Time, fresh.Runners[0].Idle.Time)
	assert.Equal(t, "cp-1", s.Runners[1].Node)

	for i := range MaxRunners + 5 {
		s.StartRunner("pod", "cp-1", false, t0, t0.Add(time.Duration(i)*time.Minute))
	}

	assert.Len(t, s.Runners, MaxRunners, "bounded")
}
