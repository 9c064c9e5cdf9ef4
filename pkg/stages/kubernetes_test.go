package stages_test

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/ichor-dev/kubectl-ichor/pkg/discovery"
	"github.com/ichor-dev/kubectl-ichor/pkg/stages"
)

// The engine asks each stage what it does (drain, roll out, move the kubelet) rather
// than which stage it is.
func TestKubernetesStagesSayWhatTheyDo(t *testing.T) {
	for _, tt := range []struct {
		stage   stages.KubernetesStage
		drains  bool
		rollout stages.Rollout
		kubelet bool
	}{
		{stage: stages.APIServers{}, rollout: stages.NoRollout},
		{stage: stages.ControlPlaneComponents{}, rollout: stages.NoRollout},
		{stage: stages.KubeProxy{}, rollout: stages.RolloutKubeProxy},
		{stage: stages.Kubelets{}, drains: true, rollout: stages.NoRollout, kubelet: true},
	} {
		t.Run(tt.stage.Name(), func(t *testing.T) {
			assert.Equal(t, tt.drains, tt.stage.Drains())
			assert.Equal(t, tt.drains, tt.stage.Work().Drains(), "a stage that drains is paced as one")
			assert.Equal(t, tt.rollout, tt.stage.Rollout())
			assert.Equal(t, tt.kubelet, tt.stage.AtTarget(discovery.Kubelet), "the stage that moves the kubelet")
		})
	}

	assert.Len(t, stages.KubernetesStages(), 4, "every stage is in the table above")
}
