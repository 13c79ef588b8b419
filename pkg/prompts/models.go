package prompts

import (
	"maps"
	"slices"
)

// PrimaryModels returns the first model of defaultChain and of every variant's own chain,
// sorted: the models a task of these families is first sent to, and so the models the batcher
// leads.
func (r *Registry) PrimaryModels(defaultChain []string) []string {
	set := map[string]bool{}
	if len(defaultChain) > 0 {
		set[defaultChain[0]] = true
	}
	for _, vs := range r.variants {
		for _, v := range vs {
			if len(v.Models) > 0 {
				set[v.Models[0]] = true
			}
		}
	}
	return slices.Sorted(maps.Keys(set))
}
