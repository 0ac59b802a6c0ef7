"""The storage CRDs rendered from the kinds: one served and stored v1alpha1 version with the status
subresource, the kind's own schema and raw fields, and no short names or categories (those are the v1's).
Installed and validating in kube-apiserver: tests/test_crds.py."""

import pytest
import yaml

from gpustack_models.kinds import GROUP, KINDS, STORAGE_VERSION
from gpustack_models.kinds.crd import CRD_DIR, HEADER, crd_files, crd_for, render


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.kind)
def test_a_crd_names_the_kind_in_the_group(kind):
    crd = crd_for(kind)
    assert (crd["apiVersion"], crd["kind"]) == ("apiextensions.k8s.io/v1", "CustomResourceDefinition")
    assert crd["metadata"]["name"] == f"{kind.plural}.{GROUP}"
    assert crd["metadata"]["labels"] == {"app.kubernetes.io/part-of": "gpustack-models"}
    spec = crd["spec"]
    assert (spec["group"], spec["scope"]) == (GROUP, kind.scope)
    assert spec["names"] == {
        "kind": kind.kind,
        "listKind": f"{kind.kind}List",
        "plural": kind.plural,
        "singular": kind.singular,
    }  # no shortNames, no categories


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.kind)
def test_a_crd_serves_and_stores_one_version_from_the_kinds_definition(kind):
    [version] = crd_for(kind)["spec"]["versions"]
    assert (version["name"], version["served"], version["storage"]) == (STORAGE_VERSION, True, True)
    assert version["subresources"] == {"status": {}}
    assert version["schema"] == {"openAPIV3Schema": kind.object_schema().to_openapi()}
    assert version["additionalPrinterColumns"] == [f.to_crd() for f in kind.fields]


@pytest.mark.parametrize("kind", KINDS, ids=lambda k: k.kind)
def test_the_rendered_file_is_the_header_then_the_crd_in_yaml(kind):
    text = render(kind)
    assert text.startswith(HEADER) and "do not edit" in HEADER
    assert yaml.safe_load(text[len(HEADER) :]) == crd_for(kind)


def test_there_is_one_file_per_kind_under_deploy_crds():
    files = crd_files()
    assert sorted(p.name for p in files) == [
        "worker.gpustack.ai_modelartifacts.yaml",
        "worker.gpustack.ai_modelprefetches.yaml",
        "worker.gpustack.ai_nodemodelstores.yaml",
    ]
    assert {p.parent for p in files} == {CRD_DIR} and CRD_DIR.parts[-2:] == ("deploy", "crds")
