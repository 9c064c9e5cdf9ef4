package stages

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/kube"
)

func TestInvariantWorseThan(t *testing.T) {
	run := func(node string, c discovery.Component, v string) kube.Running {
		return kube.Running{Node: node, Component: c, Version: v, Source: "test"}
	}

	before := JudgeInvariant([]kube.Running{
		run("cp-1", discovery.APIServer, "v1.35.4"), run("cp-2", discovery.APIServer, "v1.35.4"),
		run("worker-1", discovery.Kubelet, "v1.36.3"),
	})
	assert.Len(t, before.Skew, 1, "the worker's kubelet is newer than the apiservers")

	for _, tc := range []struct {
		name    string
		running []kube.Running
		worse   []string
	}{
		{
			name: "an apiserver forward: the same skew, not worse",
			running: []kube.Running{
				run("cp-1", discovery.APIServer, "v1.36.3"), run("cp-2", discovery.APIServer, "v1.35.4"),
				run("worker-1", discovery.Kubelet, "v1.36.3"),
			},
		},
		{
			name: "every apiserver forward: fixed",
			running: []kube.Running{
				run("cp-1", discovery.APIServer, "v1.36.3"), run("cp-2", discovery.APIServer, "v1.36.3"),
				run("worker-1", discovery.Kubelet, "v1.36.3"),
			},
		},
		{
			name: "a new skewed component",
			running: []kube.Running{
				run("cp-1", discovery.APIServer, "v1.35.4"), run("cp-1", discovery.Scheduler, "v1.36.3"),
				run("cp-2", discovery.APIServer, "v1.35.4"), run("worker-1", discovery.Kubelet, "v1.36.3"),
			},
			worse: []string{"kube-scheduler v1.36.3 on cp-1 (test) is newer than kube-apiserver v1.35.4 on cp-1"},
		},
		{
			name: "the skewed one further ahead",
			running: []kube.Running{
				run("cp-1", discovery.APIServer, "v1.35.4"), run("cp-2", discovery.APIServer, "v1.35.4"),
				run("worker-1", discovery.Kubelet, "v1.37.0"),
			},
			worse: []string{"kubelet v1.37.0 on worker-1 (test) is newer than kube-apiserver v1.35.4 on cp-1"},
		},
		{
			name: "an apiserver back",
			running: []kube.Running{
				run("cp-1", discovery.APIServer, "v1.34.2"), run("cp-2", discovery.APIServer, "v1.35.4"),
				run("worker-1", discovery.Kubelet, "v1.36.3"),
			},
			worse: []string{"kubelet v1.36.3 on worker-1 (test) is newer than kube-apiserver v1.34.2 on cp-1"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assert.Equal(t, tc.worse, JudgeInvariant(tc.running).WorseThan(before))
		})
	}

	unknown := JudgeInvariant([]kube.Running{
		{Node: "cp-1", Component: discovery.APIServer, Image: "registry.k8s.io/kube-apiserver:v1.35.4-custom", Version: "v1.35.4-custom", Source: "pod kube-system/kube-apiserver-cp-1"},
		run("cp-2", discovery.APIServer, "v1.35.4"),
	})
	assert.Equal(t, []string{`kube-apiserver on cp-1: image "registry.k8s.io/kube-apiserver:v1.35.4-custom" has no vMAJOR.MINOR.PATCH tag (pod kube-system/kube-apiserver-cp-1)`},
		unknown.UnknownLines())
}
