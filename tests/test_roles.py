"""The typed seams (contract/roles.py): every demo pack's mock teacher, the real tiny teacher the t5 demo
ships and the loaded student are what the stages take them for; a model missing a member is not."""
from __future__ import annotations

import pytest

import demo_cache
from trainer_core.contract.roles import Student, Teacher
from trainer_core.packs import DEMO_PACKS
from trainer_core.project import Project
from trainer_core.packs.lookup import require_material


@pytest.mark.parametrize("pack_id", DEMO_PACKS)
def test_every_demo_packs_mock_teacher_is_a_teacher(pack_id, tmp_path):
    project = Project.open(demo_cache.copy_built(pack_id, tmp_path))
    teacher = project.pack.build_mock_teacher(project)
    assert isinstance(teacher, Teacher) and teacher.out_dim > 0


def test_a_real_teacher_and_the_student_fill_their_roles(tmp_path):
    from trainer_core.contract.student import load_student
    project = Project.open(demo_cache.copy_built("t5xxl_pixart", tmp_path))
    pack = project.pack
    teacher = pack.build_teacher(project, "cpu")
    assert isinstance(teacher, Teacher) and teacher.mode == "cpu"
    student = load_student(require_material(project, "student"), require_material(project, "student_tokenizer"))
    assert isinstance(student, Student) and student.hidden_size == student.config.hidden_size
    assert not isinstance(object(), Teacher) and not isinstance(teacher, Student)
