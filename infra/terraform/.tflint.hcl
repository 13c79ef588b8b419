# tflint with its bundled Terraform ruleset, every rule on. The google ruleset plugin is a
# download from GitHub releases, which these machines cannot reach.
config {
  call_module_type = "none"
}

plugin "terraform" {
  enabled = true
  preset  = "all"
}
