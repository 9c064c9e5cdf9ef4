package discovery_test

import (
	"testing"

	"github.com/stretchr/testify/assert"
	appsv1 "k8s.io/api/apps/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
)

func TestDaemonSetMaxUnavailable(t *testing.T) {
	ds := func(mu *intstr.IntOrString, pods int32) *appsv1.DaemonSet {
		d := &appsv1.DaemonSet{Status: appsv1.DaemonSetStatus{DesiredNumberScheduled: pods}}
		if mu != nil {
			d.Spec.UpdateStrategy.RollingUpdate = &appsv1.RollingUpdateDaemonSet{MaxUnavailable: mu}
		}

		return d
	}
	ptr := func(v intstr.IntOrString) *intstr.IntOrString { return &v }

	for _, tc := range []struct {
		name string
		ds   *appsv1.DaemonSet
		want int
	}{
		{"default", ds(nil, 23), 1},
		{"a number", ds(ptr(intstr.FromInt32(3)), 23), 3},
		{"a percentage, rounded up", ds(ptr(intstr.FromString("10%")), 23), 3},
		{"zero counts as one", ds(ptr(intstr.FromInt32(0)), 23), 1},
		{"nonsense counts as one", ds(ptr(intstr.FromString("many")), 23), 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.want, discovery.DaemonSetMaxUnavailable(tc.ds))
		})
	}
}
