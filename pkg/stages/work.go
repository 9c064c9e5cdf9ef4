package stages

// Work is what one batch of a stage waits for, which sets the batch's pace:
// an estimate of the time left takes a stage not measured yet at the pace of
// the stages of the same work.
type Work string

// The works of the stages.
const (
	// WorkStaticPods: a config apply that restarts static pods (APIServers,
	// ControlPlaneComponents).
	WorkStaticPods Work = "static pods"
	// WorkConfig: a config apply that restarts nothing, then the bootstrap
	// manifests' sync (KubeProxy); the DaemonSet's rollout follows the batches.
	WorkConfig Work = "config"
	// WorkDrain: a cordon and drain, then a kubelet restart (Kubelets).
	WorkDrain Work = "drain"
	// WorkReboot: a cordon and drain, then a Talos upgrade and reboot (TalosOS).
	WorkReboot Work = "reboot"
)

// Drains reports whether a stage of this work cordons and drains its nodes.
func (w Work) Drains() bool { return w == WorkDrain || w == WorkReboot }

// Reboots reports whether a stage of this work takes its nodes down, every
// container on them with it. The runner's pod leaves its own node before
// such a stage reboots it; a kubelet restart (WorkDrain) leaves containers
// running, so the runner stays on its node through that node's drain and
// restart, and no replacement costs the upgrade a Job backoff.
func (w Work) Reboots() bool { return w == WorkReboot }

// StageWork is the work of the stage named name, "" for a name no stage has.
func StageWork(name string) Work {
	for _, s := range KubernetesStages() {
		if s.Name() == name {
			return s.Work()
		}
	}

	if (TalosOS{}).Name() == name {
		return TalosOS{}.Work()
	}

	return ""
}
