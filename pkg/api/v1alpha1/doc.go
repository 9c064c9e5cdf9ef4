// Package v1alpha1 holds the versioned documents kubectl-ichor prints for automation
// (`-o json|yaml`): the Plan of one upgrade, and the UpgradePath of several. Fields are
// only ever added within a version; a change of meaning gets a new version.
package v1alpha1
