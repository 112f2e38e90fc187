"""Components written once against a Backend: target model, drafter, GDN layer, caches."""
