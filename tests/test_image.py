"""The test hosts' base image recipe and its content key."""

from __future__ import annotations

import dataclasses

from specfleet.controller.image import IMAGE_REPOSITORY, ImageRecipe


def test_tag_is_keyed_by_the_recipe():
    recipe = ImageRecipe()
    assert recipe.tag() == f"{IMAGE_REPOSITORY}:{recipe.digest()}"
    assert ImageRecipe().digest() == recipe.digest()


def test_any_recipe_change_gives_a_new_image():
    base = ImageRecipe()
    changed = [
        dataclasses.replace(base, suite="trixie"),
        dataclasses.replace(base, include=(*base.include, "curl")),
        dataclasses.replace(base, docker_changes=()),
        dataclasses.replace(base, mirror="http://example.invalid/debian"),
    ]
    digests = {recipe.digest() for recipe in changed}
    assert base.digest() not in digests
    assert len(digests) == len(changed)


def test_recipe_boots_systemd_and_can_run_ansible():
    recipe = ImageRecipe()
    assert {"systemd", "systemd-sysv", "dbus", "python3", "sudo"} <= set(recipe.include)
    assert 'CMD ["/lib/systemd/systemd"]' in recipe.docker_changes
