package prompts_test

import (
	"fmt"

	"github.com/genbox-dev/genbox/pkg/prompts"
)

func ExampleRegistry_Render() {
	reg, err := prompts.Default()
	if err != nil {
		panic(err)
	}
	r, err := reg.Render("classify", "", "I was charged twice this month.", nil)
	if err != nil {
		panic(err)
	}
	fmt.Println(r.Family, r.Variant, r.Version, r.ResponseMIMEType, *r.Config.Temperature)
	fmt.Println(r.Validate(`{"category":"billing","confidence":0.9}`))
	fmt.Println(r.Validate(`{"category":"weather","confidence":0.9}`))
	retry := r.QualityRetry(r.Config)
	fmt.Println(*retry.Temperature)
	// Output:
	// classify default 2026-12-01 application/json 0.2
	// <nil>
	// classify/default: prompts: invalid output: $.category: value must be one of 'billing', 'technical', 'account', 'sales', 'other'
	// 0.1
}

func ExampleRegistry_Render_stale() {
	reg, err := prompts.Default()
	if err != nil {
		panic(err)
	}
	digest, err := reg.Render("summarize", "digest", "Sales rose 4% in March.", nil)
	if err != nil {
		panic(err)
	}
	// When every model is unavailable, a digest answers with the last good output for the same
	// tenant and subject_key (flagged stale) instead of parking.
	fmt.Println(digest.OnExhausted, digest.CacheAllowed)
	// Output:
	// stale true
}
